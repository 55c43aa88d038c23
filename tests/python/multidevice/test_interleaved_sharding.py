"""Device splits that are not one block per device (issue 12): a DID on the inner part of a split
(interleaved rows), a DID on a split nested inside another split, and one axis split over two mesh
axes (context x tensor parallelism). Each case checks its shard against unsharded PyTorch, the
references being built here with torch views (independent of meshfuser.shard_tensor), and the exact
communications with their bytes (ring accounting: an Allgather receives (d-1)/d of the gathered
tensor, a ReduceScatter sends (d-1)/d of the partial, an Allreduce twice that)."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import execute_with_plan

MESH_X, MESH_Y = ParallelType.mesh_x, ParallelType.mesh_y
F32 = 4


_plan = execute_with_plan


def _expect(d, *comms):
    return list(comms) if d > 1 else []


def _inner(tv, mesh, axis, pt=MESH_X):
    """DID on the inner part: this device holds elements i*d + rank (d = devices along pt)."""
    tv.set_device_mesh(mesh)
    tv.inner_split(axis, mesh.size_of(pt))
    tv.axis(axis + 1).parallelize(pt)


def _outer(tv, mesh, axis, pt=MESH_X):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size_of(pt))
    tv.axis(axis).parallelize(pt)


def _interleaved_rows(t, axis, d, index):
    return t.unflatten(axis, (-1, d)).select(axis + 1, index)


def _blocked_rows(t, axis, d, index):
    return t.chunk(d, dim=axis)[index]


def test_pointwise_keeps_interleaved_rows_without_communication(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([3 * d, 5])
        y = fd.define_tensor([3 * d, 5])
        out = fd.ops.mul(fd.ops.add(x, y), 2.0)
        fd.add_output(out)
        for tv in (x, y):
            _inner(tv, mesh, 0)
    ux, uy = torch.randn(3 * d, 5), torch.randn(3 * d, 5)
    (result,), comms = _plan(fd, [_interleaved_rows(ux, 0, d, rank).to(dev), _interleaved_rows(uy, 0, d, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(result.cpu(), _interleaved_rows((ux + uy) * 2, 0, d, rank))


def test_allgather_of_interleaved_rows(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 3])
        out = fd.ops.relu(x)
        fd.add_output(out)
        _inner(x, mesh, 0)
        out.set_device_mesh(mesh)
    ux = torch.randn(2 * d, 3)
    (result,), comms = _plan(fd, [_interleaved_rows(ux, 0, d, rank).to(dev)])
    gathered = 2 * d * 3 * F32
    assert comms == _expect(d, ("Allgather", (d - 1) * gathered // d, (d - 1) * gathered // d))
    if d > 1:
        assert "by-index" in fd.host_program(), fd.host_program()
    torch.testing.assert_close(result.cpu(), torch.relu(ux))


def test_blocked_to_interleaved_gathers_then_slices(multidevice_test):
    # No collective maps blocks onto interleaved rows: gather, then keep this rank's rows (a view).
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 2])
        out = fd.ops.set(x)
        fd.add_output(out)
        _outer(x, mesh, 0)
        _inner(out, mesh, 0)
    ux = torch.randn(4 * d, 2)
    (result,), comms = _plan(fd, [_blocked_rows(ux, 0, d, rank).to(dev)])
    gathered = 4 * d * 2 * F32
    kinds = [c[0] for c in comms]
    assert kinds == (["Allgather", "LocalSlice"] if d > 1 else []), comms
    if d > 1:
        assert comms[0] == ("Allgather", (d - 1) * gathered // d, (d - 1) * gathered // d)
        assert comms[1][1:] == (0, 0)
    torch.testing.assert_close(result.cpu(), _interleaved_rows(ux, 0, d, rank))


def test_sum_over_interleaved_axis_is_partial_plus_allreduce(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 4 * d])
        out = fd.ops.sum(x, [1])
        fd.add_output(out)
        _inner(x, mesh, 1)
        out.set_device_mesh(mesh)
    ux = torch.randn(6, 4 * d)
    (result,), comms = _plan(fd, [_interleaved_rows(ux, 1, d, rank).to(dev)])
    partial = 6 * F32
    assert comms == _expect(d, ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d))
    torch.testing.assert_close(result.cpu(), ux.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scatter", [False, True], ids=["allreduce", "reduce_scatter_interleaved"])
def test_row_parallel_linear_with_interleaved_contraction(multidevice_test, scatter):
    # K interleaved on x and w alike: the local partial products still sum to x @ w.T. The
    # scattered output takes interleaved rows too: a ReduceScatter that picks rows by index.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    m, n, k = 2 * d, 6, 4 * d
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([n, k])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w):
            _inner(tv, mesh, 1)
        # the contraction's device split, as the seeds write it: on the output's reduction axis
        _inner(out, mesh, 2)
        if scatter:
            out.inner_split(0, d)
            out.axis(1).parallelize(MESH_X)
    ux, uw = torch.randn(m, k), torch.randn(n, k)
    inputs = [_interleaved_rows(ux, 1, d, rank).to(dev), _interleaved_rows(uw, 1, d, rank).to(dev)]
    (result,), comms = _plan(fd, inputs)
    expected = ux @ uw.T
    partial = m * n * F32
    if scatter:
        assert comms == _expect(d, ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d))
        torch.testing.assert_close(result.cpu(), _interleaved_rows(expected, 0, d, rank), rtol=1e-5, atol=1e-4)
    else:
        assert comms == _expect(d, ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d))
        torch.testing.assert_close(result.cpu(), expected, rtol=1e-5, atol=1e-4)


def test_alltoall_from_interleaved_rows_to_column_blocks(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 3 * d])
        out = fd.ops.set(x)
        fd.add_output(out)
        _inner(x, mesh, 0)
        _outer(out, mesh, 1)
    ux = torch.randn(2 * d, 3 * d)
    (result,), comms = _plan(fd, [_interleaved_rows(ux, 0, d, rank).to(dev)])
    local = 2 * 3 * d * F32
    assert comms == _expect(d, ("AllToAll", (d - 1) * local // d, (d - 1) * local // d))
    torch.testing.assert_close(result.cpu(), _blocked_rows(ux, 1, d, rank))


def test_nested_split_device_holds_its_piece_of_each_outer_part(multidevice_test):
    # outer_split(0, 2) then outer_split(1, d): the axis is [2, d, rest]; a device holds its block
    # of each half. Pointwise stays local; a replicated output gathers by index.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d * 3])
        t = fd.ops.neg(x)
        out = fd.ops.set(t)
        fd.add_output(t)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.outer_split(1, d)
        x.axis(1).parallelize(MESH_X)
        out.set_device_mesh(mesh)
    ux = torch.arange(2 * d * 3, dtype=torch.float)
    mine = ux.view(2, d, 3)[:, rank, :].flatten()
    (t_shard, full), comms = _plan(fd, [mine.to(dev)])
    torch.testing.assert_close(t_shard.cpu(), -mine)
    torch.testing.assert_close(full.cpu(), -ux)
    assert [c[0] for c in comms] == _expect(d, "Allgather")


def test_context_and_tensor_parallel_axis_over_two_mesh_axes(multidevice_test):
    # The sequence axis split on mesh_x, each block split again on mesh_y (a [cp, tp] mesh):
    # pointwise is local, and gathering mesh_y then mesh_x rebuilds the sequence.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d % 2:
        pytest.skip("needs an even number of ranks for a [d/2, 2] mesh")
    mesh = DeviceMesh(torch.arange(d).view(d // 2, 2))
    cp, tp = d // 2, 2
    b, s, e = 2, tp * cp * 3, 4
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, s, e])
        t = fd.ops.mul(x, 3.0)
        out = fd.ops.set(t)
        fd.add_output(t)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.outer_split(1, tp)
        x.axis(1).parallelize(MESH_X)
        x.outer_split(2, cp)
        x.axis(2).parallelize(MESH_Y)
        out.set_device_mesh(mesh)
    ux = torch.randn(b, s, e)
    row, col = divmod(rank, 2)  # mesh_y index, mesh_x index
    mine = ux.view(b, tp, cp, 3, e)[:, col, row]
    (t_shard, full), comms = _plan(fd, [mine.contiguous().to(dev)])
    torch.testing.assert_close(t_shard.cpu(), mine * 3)
    torch.testing.assert_close(full.cpu(), ux * 3)
    assert [c[0] for c in comms] == (["Allgather", "Allgather"] if cp > 1 else ["Allgather"])
    # mesh_y first (inner pieces of each mesh_x block), then mesh_x (whole blocks)
    piece = b * 3 * e * F32
    if cp > 1:
        assert comms[0][2] == (cp - 1) * piece
        assert comms[1][2] == (tp - 1) * cp * piece


def test_uniform_on_interleaved_rows_matches_the_unsharded_values(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))

    def define(fd, shard):
        out = fd.ops.uniform(0.0, 1.0, [4 * d, 3], rng_seed=7, rng_offset=0)
        fd.add_output(out)
        if shard:
            _inner(out, mesh, 0)
        else:
            out.set_device_mesh(mesh)

    with FusionDefinition() as fd_whole:
        define(fd_whole, False)
    with FusionDefinition() as fd:
        define(fd, True)
    (whole,) = fd_whole.execute([])
    (mine,) = fd.execute([])
    torch.testing.assert_close(mine.cpu(), _interleaved_rows(whole.cpu(), 0, d, rank))


def test_interleaved_rows_must_divide(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d == 1:
        pytest.skip("one device divides everything")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.outer_split(1, d)
        x.axis(1).parallelize(MESH_X)
        out = fd.ops.neg(x)
        fd.add_output(out)
    # 3 local elements: a global extent of 3d, which the split by 2 does not divide
    with pytest.raises(meshfuser.Error, match="does not divide evenly"):
        fd.execute([torch.randn(3).to(dev)])


def test_gather_of_interleaved_rows_onto_another_mesh_is_refused(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d < 2:
        pytest.skip("needs two meshes")
    senders, receivers = DeviceMesh(range(d // 2 if d > 2 else 1)), DeviceMesh([d - 1])
    if senders.size < 2:
        # [0] -> [1]: a one-device sender mesh cannot hold an interleaved split that matters;
        # use the full mesh's inner split towards a one-device mesh instead
        senders = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * senders.size, 3])
        out = fd.ops.set(x)
        fd.add_output(out)
        _inner(x, senders, 0)
        out.set_device_mesh(receivers)
    local = torch.randn(2, 3).to(dev)
    with pytest.raises(meshfuser.Error, match="interleaved"):
        fd.execute([local])


def test_dtensor_view_of_interleaved_output_is_refused(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d])
        out = fd.ops.neg(x)
        fd.add_output(out)
        _inner(x, mesh, 0)
        _inner(out, mesh, 0)
    fd.execute([torch.randn(2).to(multidevice_test.device)])
    if d == 1:
        return  # one device: every split is one block
    with pytest.raises(meshfuser.Error, match="interleaved"):
        fd.get_output_shardings()


@pytest.mark.parametrize("keeps_axis", [True, False], ids=["keeps_rows", "splits_rows"])
def test_reshape_of_interleaved_rows(multidevice_test, keeps_axis):
    # A reshape that keeps the interleaved axis whole stays local; one that splits it would pair
    # different rows on each device, so the rows are gathered first (by index).
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 6])
        out = fd.ops.reshape(x, [4 * d, 2, 3] if keeps_axis else [2 * d, 2, 6])
        fd.add_output(out)
        _inner(x, mesh, 0)
        out.set_device_mesh(mesh)
        if keeps_axis:
            out.inner_split(0, d)
            out.axis(1).parallelize(MESH_X)
    ux = torch.randn(4 * d, 6)
    (result,), comms = _plan(fd, [_interleaved_rows(ux, 0, d, rank).to(dev)])
    if keeps_axis:
        assert comms == []
        torch.testing.assert_close(result.cpu(), _interleaved_rows(ux.reshape(4 * d, 2, 3), 0, d, rank))
    else:
        gathered = 4 * d * 6 * F32
        assert comms == _expect(d, ("Allgather", (d - 1) * gathered // d, (d - 1) * gathered // d))
        torch.testing.assert_close(result.cpu(), ux.reshape(2 * d, 2, 6))


def _stacked(tv, mesh):
    """[rest, mesh_x, mesh_y] on axis 0: two inner splits, mesh_y innermost."""
    tv.set_device_mesh(mesh)
    tv.inner_split(0, 2)
    tv.axis(1).parallelize(MESH_Y)
    tv.inner_split(0, 2)
    tv.axis(1).parallelize(MESH_X)


@pytest.mark.parametrize("symbolic", [False, True], ids=["constant", "symbolic"])
def test_two_stacked_interleaved_splits_propagate_exactly(multidevice_test, symbolic):
    # [rest, mesh_x, mesh_y] copied onto an unannotated pointwise result keeps both pieces in
    # their order: no communication (the copy used to swap them: an internal error).
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d != 4:
        pytest.skip("needs a 2x2 mesh")
    mesh = DeviceMesh(torch.arange(4).view(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1 if symbolic else 16])
        fd.add_output(fd.ops.neg(x))
        _stacked(x, mesh)
    ux = torch.randn(16, generator=torch.Generator().manual_seed(5))
    row, col = divmod(rank, 2)
    mine = ux.view(-1, 2, 2)[:, col, row]
    (result,), comms = _plan(fd, [mine.to(dev)])
    assert comms == []
    torch.testing.assert_close(result.cpu(), -mine)


@pytest.mark.parametrize("direction", ["add_mesh_y", "drop_mesh_y"])
def test_interleaved_split_gains_or_loses_a_nested_piece(multidevice_test, direction):
    # [?, mesh_x] and [?, mesh_x, mesh_y] give mesh_x's index different elements (mesh_y's piece
    # spaces them): they must not count as the same mesh_x split (that gave wrong numbers on two
    # of four ranks). The plan moves data and every rank gets its own elements.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d != 4:
        pytest.skip("needs a 2x2 mesh")
    mesh = DeviceMesh(torch.arange(4).view(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        y = fd.ops.neg(x)
        fd.add_output(y)
        one, two = (x, y) if direction == "add_mesh_y" else (y, x)
        one.set_device_mesh(mesh)
        one.inner_split(0, 2)
        one.axis(1).parallelize(MESH_X)
        _stacked(two, mesh)
    ux = torch.randn(16, generator=torch.Generator().manual_seed(6))
    row, col = divmod(rank, 2)
    single = lambda t: t.view(-1, 2)[:, col]  # noqa: E731
    stacked = lambda t: t.view(-1, 2, 2)[:, col, row]  # noqa: E731
    x_shard, y_shard = (single, stacked) if direction == "add_mesh_y" else (stacked, single)
    (result,), comms = _plan(fd, [x_shard(ux).to(dev)])
    assert comms, "the two splits hold different elements: data must move"
    torch.testing.assert_close(result.cpu(), y_shard(-ux))


def test_reshape_between_interleaved_layouts_is_a_user_error(multidevice_test):
    # [4d, 6] interleaved on axis 0 -> [2d, 12] interleaved on axis 0: no single move connects the
    # layouts; every rank refuses it with a meshfuser.Error (it was an internal "bug" error).
    d = multidevice_test.size
    if d == 1:
        pytest.skip("one device: nothing is sharded")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 6])
        o = fd.ops.reshape(x, [2 * d, 12])
        fd.add_output(o)
        _inner(x, mesh, 0)
        _inner(o, mesh, 0)
    with pytest.raises(meshfuser.Error, match="reshard the input first") as info:
        fd.execute([torch.zeros(4, 6)])
    assert "InternalError" not in type(info.value).__name__
