"""Sharding propagation: through pointwise chains, reshapes (to the outermost piece, with
divisibility errors) and reductions, without annotating intermediates."""
import pytest
import torch

import meshfuser
from meshfuser.testing import communication_kinds, execute_with_plan
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _shard0(tv, mesh):
    tv.set_device_mesh(mesh)
    tv.outer_split(0, mesh.size)
    tv.axis(0).parallelize(ParallelType.mesh_x)


def _comms(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    return outputs, [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def test_pointwise_chain_stays_sharded(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 4, 6])
        y = fd.ops.tanh(fd.ops.mul(x, 3.0))
        fd.add_output(fd.ops.relu(y))
    _shard0(x, mesh)
    full = torch.randn(d * 4, 6)
    (out,), comms = _comms(fd, [mesh.shard_tensor(full, 0, rank).to(multidevice_test.device)])
    assert comms == []
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 0
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(torch.relu(torch.tanh(full * 3.0)), 0, rank))


def test_reshape_merging_the_sharded_axis_outermost(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 2, 3, 5])
        fd.add_output(fd.ops.reshape(x, [d * 6, 5]))
    _shard0(x, mesh)
    full = torch.randn(d * 2, 3, 5)
    (out,), comms = _comms(fd, [mesh.shard_tensor(full, 0, rank).to(multidevice_test.device)])
    assert comms == []
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(full.reshape(d * 6, 5), 0, rank))


def test_reshape_splitting_the_sharded_axis(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 6, 5])
        fd.add_output(fd.ops.reshape(x, [d * 2, 3, 5]))
    _shard0(x, mesh)
    full = torch.randn(d * 6, 5)
    (out,), comms = _comms(fd, [mesh.shard_tensor(full, 0, rank).to(multidevice_test.device)])
    assert comms == []
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(full.reshape(d * 2, 3, 5), 0, rank))


def test_reshape_with_indivisible_outer_piece_is_an_error(multidevice_test):
    d = multidevice_test.size
    if d == 1:
        pytest.skip("needs 2+ ranks: every extent divides by 1")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        # [d(d+1), 2] -> [d+1, 2d]: the sharded axis lands on an outer piece of extent d+1.
        x = fd.define_tensor([d * (d + 1), 2])
        fd.add_output(fd.ops.reshape(x, [d + 1, 2 * d]))
    _shard0(x, mesh)
    with pytest.raises(meshfuser.Error, match=r"extent %d is not divisible by the %d devices" % (d + 1, d)):
        fd.execute([torch.randn(d + 1, 2)])


def test_sum_over_the_sharded_axis_propagates_to_an_allreduce(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 4, 6])
        fd.add_output(fd.ops.sum(fd.ops.exp(x), [0]))
    _shard0(x, mesh)
    full = torch.randn(d * 4, 6)
    (out,), comms = _comms(fd, [mesh.shard_tensor(full, 0, rank).to(multidevice_test.device)])
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms
    torch.testing.assert_close(out.cpu(), full.exp().sum(0), rtol=1e-5, atol=1e-5)


# -- reshape to rows with symbolic extents (the weight gradient of a sharded linear) ---------------

def _rows(fd, t, static_extent):
    """t [b, s, n] -> [b*s, n], with n a constant or the symbolic extent fd.ops.size(t, 2)."""
    return fd.ops.reshape(t, [-1, static_extent if static_extent is not None else fd.ops.size(t, 2)])


def _shard_last(tv, mesh):
    tv.set_device_mesh(mesh)
    tv.outer_split(2, mesh.size)
    tv.axis(2).parallelize(ParallelType.mesh_x)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_reshape_to_rows_keeps_the_sharded_last_axis(multidevice_test, symbolic):
    # [b, s, n] sharded on n -> [b*s, n]: the last axis is kept whole, so it stays sharded whether
    # the extents are constants or symbols (s0*s1 rows, s2 columns).
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1] if symbolic else [2, 3, 4 * d])
        fd.add_output(_rows(fd, x, None if symbolic else 4 * d))
    _shard_last(x, mesh)
    full = torch.randn(2, 3, 4 * d)
    (out,), comms = execute_with_plan(fd, [mesh.shard_tensor(full, 2, rank).to(multidevice_test.device)])
    assert comms == [], fd.host_program()
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1
    assert tuple(out.shape) == (6, 4)
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(full.reshape(6, 4 * d), 1, rank))


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("parallel", ["column", "row"])
def test_linear_weight_gradient_stays_sharded(multidevice_test, symbolic, parallel):
    # grad_w = grad_out_rows^T @ x_rows. Column parallel: grad_out is sharded on n (like w's rows);
    # row parallel: x is sharded on k (like w's columns). Either way grad_w is sharded like w and
    # nothing moves: before the fix, the symbolic form gathered the sharded operand (an Allgather of
    # b*s*n/d elements per rank) and returned a replicated [n, k].
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, n, k = 2, 3, 4 * d, 2 * d
    with FusionDefinition() as fd:
        g = fd.define_tensor([-1, -1, -1] if symbolic else [b, s, n])
        x = fd.define_tensor([-1, -1, -1] if symbolic else [b, s, k])
        g_rows = _rows(fd, g, None if symbolic else n)
        x_rows = _rows(fd, x, None if symbolic else k)
        fd.add_output(fd.ops.matmul(fd.ops.permute(g_rows, [1, 0]), x_rows))
    sharded = g if parallel == "column" else x
    _shard_last(sharded, mesh)
    (g if parallel == "row" else x).set_device_mesh(mesh)
    full_g, full_x = torch.randn(b, s, n), torch.randn(b, s, k)
    local_g = mesh.shard_tensor(full_g, 2, rank) if parallel == "column" else full_g
    local_x = mesh.shard_tensor(full_x, 2, rank) if parallel == "row" else full_x
    dev = multidevice_test.device
    (grad_w,), comms = execute_with_plan(fd, [local_g.to(dev), local_x.to(dev)])
    assert comms == [], fd.host_program()
    axis = 0 if parallel == "column" else 1
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == axis
    assert tuple(grad_w.shape) == ((n // d, k) if parallel == "column" else (n, k // d))
    reference = full_g.reshape(-1, n).T @ full_x.reshape(-1, k)
    torch.testing.assert_close(grad_w.cpu(), mesh.shard_tensor(reference, axis, rank), rtol=1e-5, atol=1e-5)
