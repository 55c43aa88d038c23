"""User errors in multi-rank programs: they raise meshfuser.Error on every rank, never hang."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _allgather_program(d, mesh):
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 4, 5])
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.split(0, d, False)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
    return fd


def test_bad_shape_on_one_rank(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    fd = _allgather_program(d, mesh)
    unsharded = torch.randn(d * 4, 5)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    bad = torch.randn(5, 5, device=multidevice_test.device)  # local extent 5 instead of 4
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([bad if rank == d - 1 else good])
    msg = str(e.value)
    if rank == d - 1:
        assert "input 0" in msg and "axis 0" in msg, msg
        assert "expected local extent 4" in msg and "got 5" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    # every rank is still in step: a correct call afterwards works
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), unsharded)


def test_unsharded_tensor_to_sharded_input(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 4, 5])
        out = fd.ops.relu(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.split(0, d, False)
        inp.axis(0).parallelize(ParallelType.mesh_x)
    unsharded = torch.randn(d * 4, 5, device=multidevice_test.device)
    if d == 1:
        # with one device the unsharded tensor is the shard; pass a wrong extent instead
        unsharded = torch.randn(d * 4 + 1, 5, device=multidevice_test.device)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([unsharded])
    assert "expected local extent 4" in str(e.value), str(e.value)
    assert f"got {unsharded.shape[0]}" in str(e.value), str(e.value)


def test_logical_device_axis_extent_differs_from_mesh(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with pytest.raises(meshfuser.Error):
        with FusionDefinition() as fd:
            inp = fd.define_tensor([d + 1, 4])
            out = fd.ops.relu(inp)
            fd.add_output(out)
            inp.set_device_mesh(mesh)
            inp.axis(0).parallelize(ParallelType.mesh_x)
        fd.execute([torch.randn(1, 4, device=multidevice_test.device)])


def test_device_split_factor_differs_from_mesh(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with pytest.raises(meshfuser.Error) as e:
        with FusionDefinition() as fd:
            inp = fd.define_tensor([(d + 1) * 4, 5])
            out = fd.ops.set(inp)
            fd.add_output(out)
            inp.set_device_mesh(mesh)
            inp.split(0, d + 1, False)
            inp.axis(0).parallelize(ParallelType.mesh_x)
            out.set_device_mesh(mesh)
        fd.execute([torch.randn(4, 5, device=multidevice_test.device)])
    assert str(d + 1) in str(e.value) and str(d) in str(e.value), str(e.value)


def test_reshard_two_parallel_types_at_once(multidevice_test):
    """Swapping the mesh axes of two tensor axes changes two parallel types; meshfuser splits it into
    one communication per mesh axis and still produces the right shard."""
    d = multidevice_test.size
    if d != 4:
        pytest.skip("needs 4 ranks")
    rank = multidevice_test.rank
    mesh = DeviceMesh(torch.arange(4).view(2, 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([8, 12])
        out = fd.ops.set(inp)
        fd.add_output(out)
        # inp: axis 0 on mesh_y, axis 1 on mesh_x; out: swapped
        for tv, (a0, a1) in [(inp, (ParallelType.mesh_y, ParallelType.mesh_x)),
                             (out, (ParallelType.mesh_x, ParallelType.mesh_y))]:
            tv.set_device_mesh(mesh)
            tv.split(0, 2, False)
            tv.axis(0).parallelize(a0)
            tv.split(2, 2, False)
            tv.axis(2).parallelize(a1)
    y, x = rank // 2, rank % 2
    unsharded = torch.randn(8, 12)
    local = unsharded[y * 4:(y + 1) * 4, x * 6:(x + 1) * 6].contiguous().to(multidevice_test.device)
    with meshfuser.Profiler() as prof:
        (result,) = fd.execute([local])
    expected = unsharded[x * 4:(x + 1) * 4, y * 6:(y + 1) * 6]
    torch.testing.assert_close(result.cpu(), expected)
    comms = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    assert len(comms) >= 2 and all(" on DIDx " in c or " on DIDy " in c for c in comms), comms


def test_ranks_with_different_programs_get_an_error(multidevice_test):
    """Every rank must execute the same definition; if they do not, each gets an error naming the
    ranks that differ instead of a hang or mismatched collectives."""
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 2, 3])
        y = fd.ops.relu(x) if rank == 0 else fd.ops.neg(x)  # rank 0 differs
        out = fd.ops.set(y)
        fd.add_output(out)
    out.set_device_mesh(mesh)  # replicated: an Allgather follows
    x.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    local = torch.randn(2, 3, device=multidevice_test.device)
    with pytest.raises(meshfuser.Error, match=r"compiled a different program"):
        fd.execute([local])
