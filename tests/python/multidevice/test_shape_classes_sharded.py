"""Shape classes on several ranks: a sharded program with a symbolic row count runs every row count
on one executor (the ranks agree on the global extent per call), and a class change on one rank
only (another dtype) is a meshfuser.Error on every rank, after which the program still runs."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _sharded_softmax_sum(d):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8])
        y = fd.ops.exp(x)
        fd.add_output(fd.ops.div(y, fd.ops.broadcast(fd.ops.sum(y, [1]), [False, True])))
        fd.add_output(fd.ops.sum(x, [0]))  # a reduction over the sharded rows: an Allreduce
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
    return fd, mesh


def test_every_row_count_runs_on_one_executor(multidevice_test):
    d = multidevice_test.size
    fd, mesh = _sharded_softmax_sum(d)
    for rows in (2 * d, 3 * d, 7 * d, 2 * d):
        full = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
        probs, col_sums = fd.execute([multidevice_test.shard_tensor(full, 0, mesh)])
        torch.testing.assert_close(probs.cpu(), mesh.shard_tensor(full.softmax(1), 0, multidevice_test.rank))
        torch.testing.assert_close(col_sums.cpu(), full.sum(0), rtol=1e-5, atol=1e-5)
    assert fd._handle.executors_built() == 1


def test_a_class_change_on_one_rank_is_an_error_on_every_rank(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    fd, mesh = _sharded_softmax_sum(d)
    full = torch.randn(4 * d, 8, generator=torch.Generator().manual_seed(0))
    local = multidevice_test.shard_tensor(full, 0, mesh)
    fd.execute([local])
    with pytest.raises(meshfuser.Error):
        fd.execute([local.double() if rank == d - 1 else local])
    probs, _ = fd.execute([local])  # the ranks are in step again
    torch.testing.assert_close(probs.cpu(), mesh.shard_tensor(full.softmax(1), 0, rank))
