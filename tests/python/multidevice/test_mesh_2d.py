"""2-D mesh [[0, 1], [2, 3]]: mesh_x is the last mesh axis (within a row), mesh_y the first (within a
column). Rank r has coordinates (y, x) = (r // 2, r % 2)."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


@pytest.fixture
def mesh2d(multidevice_test):
    if multidevice_test.size != 4:
        pytest.skip("needs 4 ranks")
    return DeviceMesh(torch.arange(4).view(2, 2))


def _coords(rank):
    return rank // 2, rank % 2


def _shard_2d(tv, y_axis, x_axis):
    """Split y_axis over mesh_y and x_axis over mesh_x (logical axes, y_axis < x_axis); None = not."""
    if y_axis is not None:
        tv.split(y_axis, 2, False)
        tv.axis(y_axis).parallelize(ParallelType.mesh_y)
        if x_axis is not None:
            x_axis += 1
    if x_axis is not None:
        tv.split(x_axis, 2, False)
        tv.axis(x_axis).parallelize(ParallelType.mesh_x)


def _program(mesh, out_y_axis, out_x_axis):
    with FusionDefinition() as fd:
        inp = fd.define_tensor([2 * 4, 2 * 6])
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        _shard_2d(inp, 0, 1)  # [DIDy{2}, 4, DIDx{2}, 6]
        out.set_device_mesh(mesh)
        _shard_2d(out, out_y_axis, out_x_axis)
    return fd


def test_allgather_along_mesh_x(multidevice_test, mesh2d):
    y, x = _coords(multidevice_test.rank)
    unsharded = torch.randn(8, 12)
    local = unsharded[y * 4:(y + 1) * 4, x * 6:(x + 1) * 6].contiguous().to(multidevice_test.device)
    fd = _program(mesh2d, 0, None)  # keep mesh_y on axis 0, gather axis 1 within each row
    (out,) = fd.execute([local])
    assert out.shape == (4, 12)
    torch.testing.assert_close(out.cpu(), unsharded[y * 4:(y + 1) * 4])
    sharding = fd.get_output_shardings()[0]
    assert sharding.axis_sharded_on(ParallelType.mesh_y) == 0
    assert sharding.axis_sharded_on(ParallelType.mesh_x) == -1
    comms = _communications(fd, [local])
    assert len(comms) == 1 and comms[0].startswith("Allgather"), comms


def test_allgather_along_mesh_y(multidevice_test, mesh2d):
    y, x = _coords(multidevice_test.rank)
    unsharded = torch.randn(8, 12)
    local = unsharded[y * 4:(y + 1) * 4, x * 6:(x + 1) * 6].contiguous().to(multidevice_test.device)
    fd = _program(mesh2d, None, 1)  # keep mesh_x on axis 1, gather axis 0 within each column
    (out,) = fd.execute([local])
    assert out.shape == (8, 6)
    torch.testing.assert_close(out.cpu(), unsharded[:, x * 6:(x + 1) * 6])
    sharding = fd.get_output_shardings()[0]
    assert sharding.axis_sharded_on(ParallelType.mesh_y) == -1
    assert sharding.axis_sharded_on(ParallelType.mesh_x) == 1
    comms = _communications(fd, [local])
    assert len(comms) == 1 and comms[0].startswith("Allgather"), comms


def test_allreduce_along_mesh_y(multidevice_test, mesh2d):
    y, x = _coords(multidevice_test.rank)
    with FusionDefinition() as fd:
        inp = fd.define_tensor([2, 2 * 6])
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        for tv in [inp, out]:
            tv.set_device_mesh(mesh2d)
            tv.axis(0).parallelize(ParallelType.mesh_y)  # logical device axis (reduced in out)
            tv.split(1, 2, False)
            tv.axis(1).parallelize(ParallelType.mesh_x)
    unsharded = torch.randn(2, 12)
    local = unsharded[y:y + 1, x * 6:(x + 1) * 6].contiguous().to(multidevice_test.device)
    (out_t,) = fd.execute([local])
    assert out_t.shape == (6,)
    torch.testing.assert_close(out_t.cpu(), unsharded.sum(0)[x * 6:(x + 1) * 6])
    sharding = fd.get_output_shardings()[0]
    assert sharding.axis_sharded_on(ParallelType.mesh_x) == 0
    assert sharding.axis_sharded_on(ParallelType.mesh_y) == -1
    comms = _communications(fd, [local])
    assert len(comms) == 1 and comms[0].startswith("Allreduce"), comms
