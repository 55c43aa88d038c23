"""Issue 17: no silent wrong data, no hang, every rank told, on every call (not only the first).
Faults that the per-call agreement detects before any data moves: every rank raises
meshfuser.Error, and the next correct call works. Faults that leave the ranks out of step (a
skipped call, a dead rank, the exit path) run as separate jobs: tests/python/multidevice/faults/."""
import pytest
import torch
import torch.distributed as dist

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _gather_program(d, mesh, rows):
    """[rows, 3] sharded on axis 0 -> replicated (an Allgather)."""
    with FusionDefinition() as fd:
        inp = fd.define_tensor([rows, 3])
        out = fd.ops.set(inp)
        fd.add_output(out)
        _shard(inp, mesh, 0)
        out.set_device_mesh(mesh)
    return fd


def _slice_program(d, mesh, rows):
    """Replicated [rows, 3] -> sharded on axis 0 (a LocalSlice)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([rows, 3])
        o = fd.ops.set(a)
        fd.add_output(o)
        a.set_device_mesh(mesh)
        _shard(o, mesh, 0)
    return fd


# -- Defect 1: uneven replicated -> sharded output ------------------------------------------------
@pytest.mark.parametrize("symbolic", [False, True])
def test_uneven_replicated_to_sharded_output_is_refused(multidevice_test, symbolic):
    d = multidevice_test.size
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    fd = _slice_program(d, mesh, -1 if symbolic else 2 * d + 1)
    a = torch.randn(2 * d + 1, 3, device=multidevice_test.device)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([a])
    msg = str(e.value)
    assert "output 0" in msg and "axis 0" in msg, msg
    assert f"global extent {2 * d + 1}" in msg and f"over {d} devices" in msg, msg
    assert "uneven" in msg, msg
    if symbolic:  # an even extent still works, on the same definition
        even = torch.randn(2 * d, 3, device=multidevice_test.device)
        (o,) = fd.execute([even])
        torch.testing.assert_close(o, even.chunk(d)[multidevice_test.rank])


def test_uneven_sharded_input_is_refused(multidevice_test):
    d = multidevice_test.size
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 2 * d + 1)
    with pytest.raises(meshfuser.Error, match=rf"input 0 .* axis 0: global extent {2 * d + 1} does not split "
                                              rf"evenly over {d} devices"):
        fd.execute([torch.randn(2, 3, device=multidevice_test.device)])


# -- Defect 2: symbolic extents that disagree across ranks ----------------------------------------
def test_symbolic_extents_disagree_allgather(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, -1)
    unsharded = torch.randn(4 * d, 3)
    rows = 3 if rank == 0 else 4
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([torch.randn(rows, 3, device=multidevice_test.device)])
    msg = str(e.value)
    assert "disagree on the global extent of symbolic axis" in msg and "input 0 axis 0" in msg, msg
    assert f"rank 0: {3 * d}" in msg and f"rank 1: {4 * d}" in msg, msg
    (out,) = fd.execute([multidevice_test.shard_tensor(unsharded, 0, mesh)])
    torch.testing.assert_close(out.cpu(), unsharded)


def test_symbolic_extents_disagree_allreduce(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d, -1])
        out = fd.ops.sum(x, [0])
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        out.axis(0).parallelize(ParallelType.mesh_x)
    unsharded = torch.randn(d, 4)
    cols = 5 if rank == d - 1 else 4
    with pytest.raises(meshfuser.Error, match=r"disagree on the global extent of symbolic axis .*input 0 axis 1"):
        fd.execute([torch.randn(1, cols, device=multidevice_test.device)])
    (out_t,) = fd.execute([multidevice_test.shard_tensor(unsharded, 0, mesh)])
    torch.testing.assert_close(out_t.cpu(), unsharded.sum(0))


# -- Defect 6: validation on every call, not only the first -----------------------------------------
def test_wrong_shape_on_one_rank_after_a_valid_call(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    (out,) = fd.execute([good])  # the program is validated and cached everywhere
    torch.testing.assert_close(out.cpu(), unsharded)
    bad = torch.randn(5, 3, device=multidevice_test.device)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([bad if rank == d - 1 else good])
    msg = str(e.value)
    if rank == d - 1:
        assert "expected local extent 4" in msg and "got 5" in msg, msg
    else:
        assert f"input validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute([good])  # still in step
    torch.testing.assert_close(out.cpu(), unsharded)


def test_non_contiguous_view_on_one_rank_after_a_valid_call(multidevice_test):
    """Only the strides differ (a new input signature on one rank): the right data, every rank."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    fd.execute([good])
    view = good.t().contiguous().t() if rank == d - 1 else good  # same values, column-major
    assert rank != d - 1 or not view.is_contiguous()
    for _ in range(2):
        (out,) = fd.execute([view])
        torch.testing.assert_close(out.cpu(), unsharded)


def test_program_on_a_mesh_of_one_rank_still_agrees(multidevice_test):
    """No communication in the program, yet the ranks agree on every call: a bad input on one
    rank or a different program is an error everywhere, not a hang on the others."""
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 3])
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(mesh)
    t = torch.randn(4, 3, device=multidevice_test.device)
    fd.execute([t])
    with pytest.raises(meshfuser.Error, match=r"validation failed on rank\(s\) 0|expected local extent"):
        fd.execute([torch.randn(5, 3, device=multidevice_test.device) if rank == 0 else t])
    with FusionDefinition() as other:
        y = other.define_tensor([4, 3])
        other.add_output(other.ops.neg(y) if rank == d - 1 else other.ops.relu(y))
        y.set_device_mesh(mesh)
    with pytest.raises(meshfuser.Error, match=rf"rank\(s\) {d - 1} compiled a different program"):
        other.execute([t])
    (out,) = fd.execute([t])
    if rank == 0:
        torch.testing.assert_close(out, t.relu())


# -- Defect 8: a meta tensor on one rank ------------------------------------------------------------
def test_meta_tensor_on_one_rank(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    meta = torch.empty(4, 3, device="meta")
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([meta if rank == d - 1 else good])
    msg = str(e.value)
    if rank == d - 1:
        assert "input 0" in msg and "meta tensor" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), unsharded)


# -- Defect 9: meshfuser's own process groups ------------------------------------------------------
def test_own_process_groups_do_not_interleave_with_the_users(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2:
        pytest.skip("needs 2+ ranks")
    from meshfuser import distributed as mfd
    assert mfd._world_group is not dist.group.WORLD and mfd._cpu_group is not dist.group.WORLD
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    with pytest.raises(meshfuser.Error):
        fd.execute([torch.randn(5 if rank == 0 else 4, 3, device=multidevice_test.device)])
    gathered = [None] * d
    dist.all_gather_object(gathered, ("user", rank))  # the user's own collective, right after a fault
    assert gathered == [("user", r) for r in range(d)]


# -- Strict mode -----------------------------------------------------------------------------------
def test_strict_mode_checks_every_call(multidevice_test, monkeypatch):
    d, rank = multidevice_test.size, multidevice_test.rank
    monkeypatch.setenv("MESHFUSER_DISTRIBUTED_DEBUG", "DETAIL")
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, -1)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    for _ in range(2):
        (out,) = fd.execute([good])
        torch.testing.assert_close(out.cpu(), unsharded)
    if d > 1:
        with pytest.raises(meshfuser.Error, match=r"disagree on the global extent"):
            fd.execute([good[:3] if rank == 0 else good])
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), unsharded)


def test_distributed_debug_bad_value(multidevice_test, monkeypatch):
    d = multidevice_test.size
    if d < 2:
        pytest.skip("the agreement runs with 2+ ranks")
    monkeypatch.setenv("MESHFUSER_DISTRIBUTED_DEBUG", "LOUD")
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    with pytest.raises(meshfuser.Error, match=r"MESHFUSER_DISTRIBUTED_DEBUG: unknown value 'LOUD'.*DETAIL"):
        fd.execute([torch.randn(4, 3, device=multidevice_test.device)])


def test_non_tensor_input_on_one_rank(multidevice_test):
    """An input that is not even a tensor on one rank: that rank still takes part in the
    agreement, so the others are told instead of waiting."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute(["not a tensor" if rank == d - 1 else good])
    msg = str(e.value)
    if rank == d - 1:
        assert "input 0 is a <class 'str'>" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), unsharded)


def test_cpu_on_one_rank_cuda_on_the_others(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d < 2 or multidevice_test.device.type != "cuda":
        pytest.skip("needs 2+ ranks on GPUs")
    mesh = DeviceMesh(range(d))
    fd = _gather_program(d, mesh, 4 * d)
    unsharded = torch.randn(4 * d, 3)
    good = multidevice_test.shard_tensor(unsharded, 0, mesh)
    with pytest.raises(meshfuser.Error, match=r"different kinds of device .*rank 0: cuda.*cpu"):
        fd.execute([good.cpu() if rank == d - 1 else good])
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), unsharded)


# -- Review: an in-place Allreduce must not write into memory another tensor sees ------------------
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_allreduce_of_a_slice_of_the_input_leaves_the_input_alone(multidevice_test, reduce):
    # sum over the device axis of a sharded view of the replicated input x is one Allreduce of the
    # rank's row, a view into x: reduced in place, it overwrote x's row (the caller's tensor too),
    # and x * s then read the sum back on each rank's own row.
    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    mesh = DeviceMesh(range(d))
    torch.manual_seed(0)
    u = torch.randn(d, 3)
    with FusionDefinition() as fd:
        x = fd.define_tensor([d, 3])
        y = fd.ops.set(x)
        s = getattr(fd.ops, reduce)(y, [0])
        o = fd.ops.mul(x, fd.ops.broadcast_in_dim(s, [d, 3], [1]))
        fd.add_output(o)
        x.set_device_mesh(mesh)
        s.set_device_mesh(mesh)
        o.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        y.axis(0).parallelize(ParallelType.mesh_x)
    inp = u.clone()
    (out,) = fd.execute([inp])
    stat = u.sum(0) if reduce == "sum" else u.amax(0)
    torch.testing.assert_close(out.cpu(), u * stat)
    assert torch.equal(inp, u), "the caller's input was modified"
