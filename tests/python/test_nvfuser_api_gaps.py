"""nvFuser API pieces added through single op definitions: tv.set_allocation_domain, ops on scalar
values, broadcast_in_dim to runtime extents. References are PyTorch on the same tensors."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition


# -- set_allocation_domain ---------------------------------------------------------------------------

@pytest.mark.parametrize("order", [[1, 0], [0, 1]])
def test_set_allocation_domain_orders_the_output_in_memory(order):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        y = fd.ops.exp(x)
        y.set_allocation_domain([y.axis(i) for i in order], True)
        fd.add_output(y)
    t = torch.randn(4, 6)
    (out,) = fd.execute([t])
    torch.testing.assert_close(out, t.exp())
    expected = t.permute(order).contiguous().permute([order.index(i) for i in range(2)])
    assert out.stride() == expected.stride()


def test_set_allocation_domain_of_three_axes_matches_torch_permute_layout():
    order = [2, 0, 1]
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 3, 4])
        y = fd.ops.mul(x, 2.0)
        y.set_allocation_domain(order, [True, True, True])
        fd.add_output(y)
    t = torch.randn(2, 3, 4)
    (out,) = fd.execute([t])
    torch.testing.assert_close(out, t * 2)
    assert out.stride() == t.permute(order).contiguous().permute([order.index(i) for i in range(3)]).stride()
    assert "stride_order=" in str(fd)


def test_set_allocation_domain_keeps_a_split_axis_in_order():
    """The pieces of a split axis next to each other, outer first: the order of the whole axis."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        y = fd.ops.neg(x)
        y.split(0, 2)  # [4, 2, 6]
        y.set_allocation_domain([2, 0, 1], True)
        fd.add_output(y)
    t = torch.randn(8, 6)
    (out,) = fd.execute([t])
    torch.testing.assert_close(out, -t)
    assert out.stride() == (1, 8)


def test_set_allocation_domain_refuses_what_the_runtime_cannot_lay_out():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        y = fd.ops.neg(x)
        y.split(0, 2)
        with pytest.raises(meshfuser.Error, match=r"separates the pieces of logical axis 0"):
            y.set_allocation_domain([0, 2, 1], True)
        with pytest.raises(meshfuser.Error, match=r"puts an inner piece of logical axis 0 before its outer piece"):
            y.set_allocation_domain([1, 0, 2], True)
        with pytest.raises(meshfuser.Error, match=r"takes each of the 3 loop axes once"):
            y.set_allocation_domain([0, 1], True)
        with pytest.raises(meshfuser.Error, match=r"names loop axis 1 twice"):
            y.set_allocation_domain([0, 1, 1], True)


# -- ops on scalar values ---------------------------------------------------------------------------

def test_ops_on_runtime_scalars_give_scalars_usable_as_operands():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        s = fd.define_scalar(dtype=DataType.Double)
        factor = fd.ops.mul(fd.ops.reciprocal(s), fd.ops.add(s, 1.0))  # (1 / s) * (s + 1)
        fd.add_output(fd.ops.mul(x, factor))
        fd.add_output(fd.ops.sub(x, fd.ops.sqrt(s)))
    t = torch.randn(4, 6)
    for value in [4.0, 0.5]:
        out, shifted = fd.execute([t, value])
        torch.testing.assert_close(out, t * ((1 / value) * (value + 1)))
        torch.testing.assert_close(shifted, t - value ** 0.5)


def test_scalar_ops_of_an_extent_give_a_mean():
    """nvFuser's mean: sum times the reciprocal of the extent, taken when the program runs."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        inv = fd.ops.reciprocal(fd.ops.size(x, 1))
        fd.add_output(fd.ops.mul(fd.ops.sum(x, [1]), inv))
    for cols in [6, 10]:
        t = torch.randn(3, cols)
        torch.testing.assert_close(fd.execute([t])[0], t.mean(1))


def test_ops_on_constant_scalars_fold():
    with FusionDefinition() as fd:
        x = fd.define_tensor([3])
        half = fd.ops.reciprocal(fd.define_scalar(2.0))
        fd.add_output(fd.ops.mul(x, fd.ops.maximum(half, 0.25)))
    assert "0.5" in str(fd) and "reciprocal" not in str(fd)
    t = torch.randn(3)
    torch.testing.assert_close(fd.execute([t])[0], t * 0.5)


def test_integer_scalar_ops_on_extents_stay_usable_as_shapes():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        rows, cols = fd.ops.shape(x)
        fd.add_output(fd.ops.reshape(x, [fd.ops.mul(rows, cols)]))
    t = torch.randn(3, 4)
    assert torch.equal(fd.execute([t])[0], t.reshape(12))


# -- broadcast_in_dim to runtime extents ------------------------------------------------------------

def test_broadcast_in_dim_to_the_shape_of_another_tensor():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        y = fd.define_tensor([-1, -1])
        b = fd.ops.broadcast_in_dim(x, fd.ops.shape(y), [1])
        fd.add_output(fd.ops.add(b, y))
        fd.add_output(b)
    for rows, cols in [(3, 5), (2, 7)]:
        xs, ys = torch.randn(cols), torch.randn(rows, cols)
        out, b = fd.execute([xs, ys])
        torch.testing.assert_close(out, xs + ys)
        assert torch.equal(b, xs.expand(rows, cols))


def test_broadcast_in_dim_expands_a_broadcast_axis_to_a_size_and_a_scalar_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, 4])
        y = fd.define_tensor([-1, 4])
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.broadcast_in_dim(x, [fd.ops.size(y, 0), 4], [0, 1]))
        fd.add_output(fd.ops.broadcast_in_dim(x, [n, fd.ops.size(y, 0), 4], [1, 2]))
    xs, ys = torch.randn(1, 4), torch.randn(3, 4)
    a, b = fd.execute([xs, ys, 2])
    assert torch.equal(a, xs.expand(3, 4))
    assert torch.equal(b, xs.expand(2, 3, 4))
