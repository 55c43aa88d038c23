"""Sharding propagation: through pointwise chains, reshapes (to the outermost piece, with
divisibility errors) and reductions, without annotating intermediates."""
import pytest
import torch

import meshfuser
from meshfuser.testing import communication_kinds
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
