"""triu on sharded tensors (1-4 ranks): a split on a leading axis passes through with no
communication; a split on one of the two axes triu reads positions along is gathered first. Each
rank checks its shard of torch.triu on the unsharded tensor."""
import pytest
import torch

from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import execute_with_plan

F32 = 4
pytestmark = pytest.mark.timeout(60)


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def test_triu_sharded_on_a_batch_axis_stays_local(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 4, 4])
        fd.add_output(fd.ops.triu(x, diagonal=1))
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 4, 4)
    (res,), comms = execute_with_plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.triu(full, 1), 0, rank))


def test_triu_sharded_on_a_row_axis_gathers_first(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 2 * d, 5])
        fd.add_output(fd.ops.triu(x))
        _shard(x, mesh, 1)
    full = torch.randn(3, 2 * d, 5)
    (res,), comms = execute_with_plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
    local_bytes = 3 * 2 * 5 * F32
    assert comms == ([("Allgather", (d - 1) * local_bytes, (d - 1) * local_bytes)] if d > 1 else [])
    torch.testing.assert_close(res.cpu(), torch.triu(full).to(res.dtype))
