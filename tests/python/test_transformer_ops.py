"""Ops for transformer layers on one process, against PyTorch on the same tensors: var_mean, slice,
cat, pad, size/shape with symbolic reshape, stride_order, where. Static and symbolic shapes."""
import re

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, FusionDefinition

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}
DTYPE_IDS = ["f32", "bf16"]


def _run(build, inputs):
    with FusionDefinition() as fd:
        outs = build(fd)
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(o)
    return fd, fd.execute(inputs)


def _define(fd, t, symbolic):
    return fd.define_tensor([-1] * t.dim() if symbolic else list(t.shape), dtype=DTYPES.get(t.dtype, DataType.Float))


# -- var_mean ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("dims,correction,keepdim", [([1], 1, False), ([0, 2], 0, True), ([-1], 2, False)])
def test_var_mean(dtype, symbolic, dims, correction, keepdim):
    torch.manual_seed(0)
    x = (torch.randn(3, 5, 7) * 3 + 100).to(dtype)  # a large mean: a one-pass formula would cancel
    _, (var, mean) = _run(lambda fd: fd.ops.var_mean(_define(fd, x, symbolic), dims, correction=correction,
                                                      keepdim=keepdim), [x])
    ref_var, ref_mean = torch.var_mean(x, dims, correction=correction, keepdim=keepdim)
    torch.testing.assert_close(mean, ref_mean)
    torch.testing.assert_close(var, ref_var)


def test_var_mean_correction_at_least_count_gives_inf_like_pytorch():
    x = torch.randn(4, 2)
    _, (var, mean) = _run(lambda fd: fd.ops.var_mean(fd.define_tensor([4, 2]), [1], correction=2), [x])
    torch.testing.assert_close(var, torch.var_mean(x, [1], correction=2)[0])


def test_var_mean_of_an_integer_tensor_is_an_error():
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"var_mean: T0 has dtype int64; var_mean needs a floating-point"):
            fd.ops.var_mean(fd.define_tensor([2, 3], dtype=DataType.Int), [1])


def test_var_mean_dim_out_of_range():
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"var_mean: dim 2 is out of range for T0 of rank 2"):
            fd.ops.var_mean(fd.define_tensor([2, 3]), [2])


# -- slice ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_slice_static_bounds(symbolic):
    x = torch.randn(6, 9)
    # Negative bounds count from the end, bounds past the end clamp, an end before the start is
    # empty: on a symbolic axis too, where the clamping happens when the call binds the extent.
    for starts, ends, strides in [([-4, 2], [100, -1], [2, 3]), ([1, 0], [5, 9], [1, 2]), ([7, -2], [-100, 4], [1, 1])]:
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.slice(_define(fd, x, symbolic), starts, ends, strides))
        ref = x[starts[0]:ends[0]:strides[0], starts[1]:ends[1]:strides[1]]
        (out,) = fd.execute([x])
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref)
        if symbolic:  # the same definition at another extent
            y = torch.randn(3, 2)
            torch.testing.assert_close(fd.execute([y])[0], y[starts[0]:ends[0]:strides[0], starts[1]:ends[1]:strides[1]])


def test_slice_scalar_bounds():
    x = torch.randn(8, 10)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1])
        start, end = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.slice(tx, [0, start], [fd.ops.size(tx, 0), end]))
    # PyTorch's normalization of runtime bounds: negative from the end, clamped, end before start empty.
    for s, e in [(2, 7), (0, 10), (4, 4), (-3, 100), (-100, -2), (7, 3), (12, 20), (-1, -1)]:
        (out,) = fd.execute([x, s, e])
        assert out.shape == x[:, s:e].shape, (s, e)
        torch.testing.assert_close(out, x[:, s:e])


def test_slice_bounds_from_size_arithmetic_with_negative_constants():
    # size(x, 1) - 2 written as an add of -2: the extent text must still evaluate ("s1+-2" did not).
    x = torch.randn(3, 10)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1])
        end = fd.ops.add(fd.ops.size(tx, 1), -2)
        fd.add_output(fd.ops.slice(tx, [0, 1], [fd.ops.size(tx, 0), end]))
    torch.testing.assert_close(fd.execute([x])[0], x[:, 1:8])
    torch.testing.assert_close(fd.execute([x[:, :3]])[0], x[:, 1:1])  # 3 columns: end 3 - 2 = 1, empty


def test_split_of_a_sliced_symbolic_axis_divides_the_whole_extent():
    # The inner extent of an outer split of a derived extent divides all of it: "(s0-(...))/2".
    with FusionDefinition() as fd:
        out = fd.ops.slice(fd.define_tensor([-1]), [1], [-1])
        fd.add_output(out)
        out.outer_split(0, 2)
    text = str(fd)
    whole = re.search(r"T1_float\[i\d+\{(.+)\}\]", text).group(1)
    assert "-" in whole and "i3{(" + whole + ")/2}" in text, text


def test_slice_scalar_bounds_out_of_range_with_manual_normalization():
    # manual_normalization: bounds are used as given, so a runtime bound outside the axis is an error.
    for shape in ([4], [-1]):
        with FusionDefinition() as fd:
            tx = fd.define_tensor(shape)
            start = fd.define_scalar(dtype=DataType.Int)
            fd.add_output(fd.ops.slice(tx, [start], [4], manual_normalization=True))
        with pytest.raises(meshfuser.Error, match=r"slice: axis 0 of T0 has extent 4 but the bounds are \[5, 4\)"):
            fd.execute([torch.randn(4), 5])
        torch.testing.assert_close(fd.execute([torch.arange(4.0), 1])[0], torch.arange(1.0, 4.0))


def test_slice_manual_normalization_uses_bounds_as_given():
    x = torch.randn(6, 4)
    _, (out,) = _run(lambda fd: fd.ops.slice(fd.define_tensor([6, 4]), [1, 0], [5, 4], [2, 1],
                                             manual_normalization=True), [x])
    torch.testing.assert_close(out, x[1:5:2])
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"slice: axis 0 of T0 has bounds \[-2, 6\) with manual_norm"):
            fd.ops.slice(fd.define_tensor([6, 4]), [-2, 0], [6, 4], manual_normalization=True)


def test_slice_errors():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 5])
        with pytest.raises(meshfuser.Error, match=r"slice: T0 has 2 axes but start_indices has 1 and end_indices 2"):
            fd.ops.slice(x, [0], [1, 2])
        with pytest.raises(meshfuser.Error, match=r"slice: axis 1 of T0 has stride 0; strides must be positive"):
            fd.ops.slice(x, [0, 0], [1, 2], [1, 0])
        with pytest.raises(meshfuser.Error, match=r"slice: start of axis 0 must be an integer; got a double"):
            fd.ops.slice(x, [fd.define_scalar(1.5), 0], [2, 2])


# -- cat and pad ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dtype, symbolic, dim):
    torch.manual_seed(0)
    shapes = {0: [(2, 3), (4, 3), (1, 3)], 1: [(2, 3), (2, 1), (2, 5)], -1: [(2, 3), (2, 1), (2, 5)]}[dim]
    xs = [torch.randn(s).to(dtype) for s in shapes]
    _, (out,) = _run(lambda fd: fd.ops.cat([_define(fd, x, symbolic) for x in xs], dim), xs)
    torch.testing.assert_close(out, torch.cat(xs, dim))


def test_cat_extent_mismatch():
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([2, 3]), fd.define_tensor([2, 4])
        with pytest.raises(meshfuser.Error, match=r"cat: manual_padding=True .* is not supported"):
            fd.ops.cat([a, b], 1, manual_padding=True)
        with pytest.raises(meshfuser.Error, match=r"cat: tensor 1 \(T1\) has extent 4 at axis 1 but tensor 0 has 3"):
            fd.ops.cat([a, b], 0)
        with pytest.raises(meshfuser.Error, match=r"cat: dim 2 is out of range for T0 of rank 2"):
            fd.ops.cat([a, b], 2)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("widths,value", [([1, 2], None), ([0, 1, 3, 0], 2.5), ([-1, 2], -1.0)])
def test_pad(symbolic, widths, value):
    x = torch.randn(4, 5)
    _, (out,) = _run(lambda fd: fd.ops.pad(_define(fd, x, symbolic), widths, value), [x])
    torch.testing.assert_close(out, F.pad(x, widths, value=0.0 if value is None else value))


def test_pad_widths_not_pairs():
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"pad: pad_widths has 3 entries; expected pairs"):
            fd.ops.pad(fd.define_tensor([2, 3]), [1, 1, 1])


def test_rotary_halves_with_slice_and_cat():
    # RoPE's rotate_half: cat(-x2, x1) over the halves of the last axis.
    x = torch.randn(2, 3, 8)

    def build(fd):
        tx = fd.define_tensor([-1, -1, 8])
        n, t = fd.ops.size(tx, 0), fd.ops.size(tx, 1)
        x1 = fd.ops.slice(tx, [0, 0, 0], [n, t, 4])
        x2 = fd.ops.slice(tx, [0, 0, 4], [n, t, 8])
        return fd.ops.cat([fd.ops.neg(x2), x1], -1)

    _, (out,) = _run(build, [x])
    torch.testing.assert_close(out, torch.cat([-x[..., 4:], x[..., :4]], -1))


# -- size, shape and reshape with symbolic extents -----------------------------------------------

def test_reshape_symbolic_with_inferred_axis():
    x = torch.randn(3, 4, 6)
    fd, (out,) = _run(lambda fd: fd.ops.reshape(fd.define_tensor([-1, -1, 6]), [-1, 2, 3]), [x])
    torch.testing.assert_close(out, x.reshape(-1, 2, 3))
    (out,) = fd.execute([torch.arange(5 * 2 * 6.0).reshape(5, 2, 6)])  # other extents, same definition
    torch.testing.assert_close(out, torch.arange(5 * 2 * 6.0).reshape(-1, 2, 3))


def test_reshape_with_size_and_shape():
    x = torch.randn(3, 8)

    def build(fd):
        tx = fd.define_tensor([-1, -1])
        heads = fd.ops.reshape(tx, [fd.ops.size(tx, 0), 4, -1])
        back = fd.ops.reshape(heads, fd.ops.shape(tx))
        doubled = fd.ops.reshape(tx, [fd.ops.mul(fd.ops.size(tx, 0), 2), -1])
        return heads, back, doubled

    _, (heads, back, doubled) = _run(build, [x])
    torch.testing.assert_close(heads, x.reshape(3, 4, -1))
    torch.testing.assert_close(back, x)
    torch.testing.assert_close(doubled, x.reshape(6, -1))


def test_reshape_with_scalar_input_size():
    x = torch.randn(4, 6)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1])
        rows = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.reshape(tx, [rows, -1]))
    for r in (2, 8):
        (out,) = fd.execute([x, r])
        torch.testing.assert_close(out, x.reshape(r, -1))


def test_size_prints_as_an_extent_scalar():
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, 6])
        fd.add_output(fd.ops.reshape(tx, [fd.ops.size(tx, 0), 2, 3]))
        fd.add_output(fd.ops.slice(tx, [1, 0], [fd.ops.size(tx, 0), 6]))
    text = str(fd)
    assert "reshape(T0, shape=[-1, 2, 3])" in text, text
    assert "{s0}_int64, 0_int64, 6_int64, strides=[1, 1])" in text, text
    assert "{s0-(min(1, s0))}" in text, text  # the start clamped to the extent when the call binds s0


def test_size_of_a_static_axis_is_a_constant():
    with FusionDefinition() as fd:
        tx = fd.define_tensor([3, -1])
        assert not fd.ops.size(tx, 0).is_extent
        assert fd.ops.size(tx, 1).is_extent
        with pytest.raises(meshfuser.Error, match=r"size: dim 2 is out of range for T0 of rank 2"):
            fd.ops.size(tx, 2)


def test_reshape_element_count_mismatch():
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"reshape: T0 has shape \[2, 3\] \(6 elements\) but .* has 8"):
            fd.ops.reshape(fd.define_tensor([2, 3]), [2, 4])


# -- stride_order ----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [[2, 1, 0], [0, 1, 2], [1, 2, 0], [2, 0, 1]])
def test_stride_order(order):
    x = torch.randn(2, 3, 4)
    _, (out,) = _run(lambda fd: fd.ops.stride_order(fd.ops.add(fd.define_tensor([2, 3, 4]), 1.0), order), [x])
    torch.testing.assert_close(out, x + 1)
    # Axis i's stride ranks stride_order[i]: sorting axes by stride gives the same order.
    by_stride = sorted(range(3), key=lambda a: out.stride(a))
    by_order = sorted(range(3), key=lambda a: order[a])
    assert by_stride == by_order, (out.stride(), order)


def test_stride_order_not_a_permutation():
    with FusionDefinition() as fd:
        with pytest.raises(meshfuser.Error, match=r"stride_order: \[0, 0\] is not a permutation of 0..1"):
            fd.ops.stride_order(fd.define_tensor([2, 3]), [0, 0])


# -- where -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_where_tensors_broadcast(dtype):
    torch.manual_seed(0)
    c = torch.randn(4, 1) > 0
    a = torch.randn(1, 5).to(dtype)
    b = torch.randn(3, 4, 5).to(dtype)

    def build(fd):
        tc = fd.define_tensor([4, 1], dtype=DataType.Bool)
        return fd.ops.where(tc, fd.define_tensor([1, 5], dtype=DTYPES[dtype]),
                            fd.define_tensor([3, 4, 5], dtype=DTYPES[dtype]))

    _, (out,) = _run(build, [c, a, b])
    torch.testing.assert_close(out, torch.where(c, a, b))


@pytest.mark.parametrize("position", ["cond", "a", "b", "a_and_b"])
def test_where_scalars(position):
    c = torch.randn(3, 4) > 0
    a, b = torch.randn(3, 4), torch.randn(3, 4)

    def build(fd):
        tc = True if position == "cond" else fd.define_tensor([3, 4], dtype=DataType.Bool)
        ta = 2.5 if position in ("a", "a_and_b") else fd.define_tensor([3, 4])
        tb = -1.0 if position in ("b", "a_and_b") else fd.define_tensor([3, 4])
        return fd.ops.where(tc, ta, tb)

    inputs = ([] if position == "cond" else [c]) + ([] if position in ("a", "a_and_b") else [a]) + (
        [] if position in ("b", "a_and_b") else [b])
    _, (out,) = _run(build, inputs)
    ref = torch.where(torch.tensor(True) if position == "cond" else c,
                      2.5 if position in ("a", "a_and_b") else a, -1.0 if position in ("b", "a_and_b") else b)
    torch.testing.assert_close(out, ref.to(torch.float32))
