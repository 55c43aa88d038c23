"""Plan catalogue: for each layer form, the exact communications this rank runs and the bytes it
sends and receives, derived here by hand from the shapes (ring-algorithm accounting, see
csrc/host/communication_bytes.h), plus the numbers against unsharded PyTorch."""
import os

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import execute_with_plan

RTOL, ATOL = 1.3e-6, 1e-4
F32 = 4


def _plan(fd, inputs):
    outputs, comms = execute_with_plan(fd, inputs)
    if os.environ.get("MESHFUSER_PRINT_PLANS") and meshfuser.Communicator.instance().rank() == 0:
        # (kind, bytes sent, bytes received) per communication: the catalogue's table
        print(f"\nPLAN {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}: {comms}")
    return outputs, comms


def _shard(tv, mesh, axis, loop_axis=None, pt=ParallelType.mesh_x):
    tv.set_device_mesh(mesh)
    tv.split(axis, mesh.size if pt == ParallelType.mesh_x or len(mesh.shape) == 1 else mesh.shape[0], False)
    tv.axis(axis if loop_axis is None else loop_axis).parallelize(pt)


def _expect(d, *comms):
    """The communications a plan runs on `d` devices: none on one device (NoOp)."""
    return list(comms) if d > 1 else []


def _row_parallel(d, m, n, k, bias, scatter):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, d * k])
        w = fd.define_tensor([n, d * k])
        b = fd.define_tensor([n]) if bias else None
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        for tv in (x, w, out):
            _shard(tv, mesh, -1, -2)
        if b is not None:
            b.set_device_mesh(mesh)
        if scatter:
            out.split(0, d, False)
            out.axis(0).parallelize(ParallelType.mesh_x)
    return fd, mesh


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("scatter", [False, True], ids=["allreduce", "reduce_scatter"])
def test_row_parallel_linear(multidevice_test, bias, scatter):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 4 * d, 6, 8
    fd, mesh = _row_parallel(d, m, n, k, bias, scatter)
    ux, uw, ub = torch.randn(m, d * k), torch.randn(n, d * k), torch.randn(n)
    inputs = [mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)] + ([ub.to(dev)] if bias else [])
    (out,), comms = _plan(fd, inputs)
    expected = F.linear(ux, uw, ub if bias else None)
    partial = m * n * F32  # this rank's partial product [m, n]
    if scatter:
        # One ReduceScatter of the partial product; the bias is added to the scattered rows.
        assert comms == _expect(d, ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d))
        rs = (d - 1) * partial // d
        if d > 1:  # the printed plan shows the same bytes and their total
            assert f"bytes: sent={rs} received={rs}" in fd.host_program(), fd.host_program()
            assert f"total bytes: sent={rs} received={rs}" in fd.host_program(), fd.host_program()
        torch.testing.assert_close(out.cpu(), mesh.shard_tensor(expected, 0, rank), rtol=RTOL, atol=ATOL)
    else:
        assert comms == _expect(d, ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d))
        torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("gather", [False, True], ids=["sharded_out", "allgather_out"])
def test_column_parallel_linear(multidevice_test, gather):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 5, 4 * d, 8
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([n, k])
        b = fd.define_tensor([n])
        y = fd.ops.linear(x, w, b)
        out = fd.ops.set(y) if gather else y
        fd.add_output(out)
        x.set_device_mesh(mesh)
        _shard(w, mesh, 0)
        _shard(b, mesh, 0)
        _shard(y, mesh, 1)
        if gather:
            out.set_device_mesh(mesh)
    ux, uw, ub = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    (res,), comms = _plan(fd, [ux.to(dev), mesh.shard_tensor(uw, 0, rank).to(dev), mesh.shard_tensor(ub, 0, rank).to(dev)])
    expected = F.linear(ux, uw, ub)
    if gather:
        shard = m * (n // d) * F32
        assert comms == _expect(d, ("Allgather", (d - 1) * shard, (d - 1) * shard))
        torch.testing.assert_close(res.cpu(), expected, rtol=RTOL, atol=ATOL)
    else:
        assert comms == []
        torch.testing.assert_close(res.cpu(), mesh.shard_tensor(expected, 1, rank), rtol=RTOL, atol=ATOL)


def _mlp(d, t, h, sequence_parallel):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, h])
        w1 = fd.define_tensor([4 * h, h])
        w2 = fd.define_tensor([h, 4 * h])
        y = fd.ops.gelu(fd.ops.linear(x, w1))
        out = fd.ops.linear(y, w2)
        fd.add_output(out)
        _shard(w1, mesh, 0)
        _shard(w2, mesh, 1)
        if sequence_parallel:
            # Only the sequence split of the output is annotated; the cost model reduces the second
            # linear across devices (its operands are sharded along the contraction) and scatters it.
            _shard(x, mesh, 0)
            out.set_device_mesh(mesh)
            out.split(0, d, False)
            out.axis(0).parallelize(ParallelType.mesh_x)
        else:
            x.set_device_mesh(mesh)
    return fd, mesh


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "sp"])
def test_megatron_mlp(multidevice_test, sequence_parallel):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, h = 4 * d, 4 * d
    fd, mesh = _mlp(d, t, h, sequence_parallel)
    ux, uw1, uw2 = torch.randn(t, h), torch.randn(4 * h, h) / 4, torch.randn(h, 4 * h) / 8
    x_in = mesh.shard_tensor(ux, 0, rank) if sequence_parallel else ux
    (out,), comms = _plan(fd, [x_in.to(dev), mesh.shard_tensor(uw1, 0, rank).to(dev), mesh.shard_tensor(uw2, 1, rank).to(dev)])
    expected = F.linear(F.gelu(F.linear(ux, uw1)), uw2)
    partial = t * h * F32
    if sequence_parallel:
        # Allgather of the sequence-sharded input before the column-parallel linear, ReduceScatter after the row-parallel one.
        gathered = (d - 1) * (t // d) * h * F32
        assert comms == _expect(d, ("Allgather", gathered, gathered),
                                ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d))
        torch.testing.assert_close(out.cpu(), mesh.shard_tensor(expected, 0, rank), rtol=1e-4, atol=1e-4)
    else:
        assert comms == _expect(d, ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d))
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_attention_projection_heads_sharded(multidevice_test):
    # [t, heads*dim] sharded on the merged axis reshapes to [t, heads, dim] sharded on heads locally.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, heads, dim = 3, 2 * d, 4
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, heads * dim])
        out = fd.ops.reshape(x, [t, heads, dim])
        fd.add_output(out)
        _shard(x, mesh, 1)
    full = torch.randn(t, heads * dim)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full.reshape(t, heads, dim), 1, rank))


def test_alltoall_moves_the_sharded_axis(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 3 * d])
        out = fd.ops.set(x)
        fd.add_output(out)
        _shard(x, mesh, 0)
        _shard(out, mesh, 1)
    full = torch.randn(2 * d, 3 * d)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    local = 2 * 3 * d * F32
    assert comms == _expect(d, ("AllToAll", (d - 1) * local // d, (d - 1) * local // d))
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full, 1, rank))


def test_pipeline_move_between_meshes(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d < 2:
        pytest.skip("a move between two meshes needs 2 ranks")
    first, second = DeviceMesh([0]), DeviceMesh([1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 5])
        y = fd.ops.relu(x)
        out = fd.ops.exp(y)
        fd.add_output(out)
        x.set_device_mesh(first)
        y.set_device_mesh(first)
        out.set_device_mesh(second)
    full = torch.randn(4, 5)
    outs, comms = _plan(fd, [full.to(dev)])
    nbytes = 4 * 5 * F32
    if rank == 0:
        assert comms == [("Broadcast", nbytes, 0)]
    elif rank == 1:
        assert comms == [("Broadcast", 0, nbytes)]
        torch.testing.assert_close(outs[0].cpu(), torch.exp(torch.relu(full)))
    else:
        assert comms == []


def test_two_dimensional_mesh_data_and_tensor_parallel(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d != 4:
        pytest.skip("a 2 x 2 mesh needs 4 ranks")
    mesh = DeviceMesh(torch.arange(4).view(2, 2))  # mesh_y: data, mesh_x: tensor
    m, n, k = 4, 6, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, 2 * k])
        w = fd.define_tensor([n, 2 * k])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            tv.set_device_mesh(mesh)
            tv.split(-1, 2, False)
            tv.axis(-2).parallelize(ParallelType.mesh_x)
        for tv in (x, out):
            tv.split(0, 2, False)
            tv.axis(0).parallelize(ParallelType.mesh_y)
    ux, uw = torch.randn(m, 2 * k), torch.randn(n, 2 * k)
    y, xi = divmod(rank, 2)
    x_local = ux.chunk(2, 0)[y].chunk(2, 1)[xi]
    (res,), comms = _plan(fd, [x_local.to(dev), uw.chunk(2, 1)[xi].to(dev)])
    partial = (m // 2) * n * F32
    assert comms == [("Allreduce", partial, partial)]  # 2 (n-1)/n * P with n = 2, within each row
    torch.testing.assert_close(res.cpu(), F.linear(ux, uw).chunk(2, 0)[y], rtol=RTOL, atol=ATOL)


def _row_parallel_unannotated_reduction(d, m, n, k, scatter):
    """Row-parallel linear whose output the user annotated without the reduction's device split."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, d * k])
        w = fd.define_tensor([n, d * k])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        _shard(x, mesh, -1, -2)
        _shard(w, mesh, -1, -2)
        out.set_device_mesh(mesh)
        if scatter:
            out.split(0, d, False)
            out.axis(0).parallelize(ParallelType.mesh_x)
    return fd, mesh


@pytest.mark.parametrize("scatter", [False, True], ids=["replicated_out", "scattered_out"])
def test_cost_model_reduces_across_devices_when_cheaper(multidevice_test, scatter):
    # A small output and large operands: a partial product plus one reduction across devices moves
    # fewer bytes than gathering x and w, so the compiler adds the reduction's device split.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d, 4, 64
    fd, mesh = _row_parallel_unannotated_reduction(d, m, n, k, scatter)
    ux, uw = torch.randn(m, d * k), torch.randn(n, d * k)
    (out,), comms = _plan(fd, [mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)])
    expected = F.linear(ux, uw)
    partial = m * n * F32
    if scatter:
        assert comms == _expect(d, ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d))
        torch.testing.assert_close(out.cpu(), mesh.shard_tensor(expected, 0, rank), rtol=RTOL, atol=ATOL)
    else:
        assert comms == _expect(d, ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d))
        torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)


def test_cost_model_gathers_operands_when_cheaper(multidevice_test):
    # A large output and a short contraction: gathering x and w moves fewer bytes than an Allreduce
    # of the whole output, so no reduction across devices is added.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 64, 64, 1
    fd, mesh = _row_parallel_unannotated_reduction(d, m, n, k, scatter=False)
    ux, uw = torch.randn(m, d * k), torch.randn(n, d * k)
    (out,), comms = _plan(fd, [mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)])
    kinds = [c[0] for c in comms]
    assert "Allreduce" not in kinds and kinds == (["Allgather", "Allgather"] if d > 1 else []), comms
    sent = sum(c[1] for c in comms)
    assert sent == (d - 1) * (m * k + n * k) * F32  # each rank sends its x and w shards to d-1 peers
    torch.testing.assert_close(out.cpu(), F.linear(ux, uw), rtol=RTOL, atol=ATOL)


def test_unannotated_partial_read_only_sequence_split_is_reduce_scattered(multidevice_test):
    """A row-parallel linear with bias whose result nobody annotated and whose only reader is a
    residual add split on the sequence (Megatron's SP block from DTensor inputs): one ReduceScatter
    of the partial product, not an Allreduce plus a local slice (half the bytes); the bias is added
    to the scattered rows."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    t, k, n = 4 * d, 4 * d, 6
    gen = torch.Generator().manual_seed(3)
    ux, uw, ub, ur = (torch.randn(*s, generator=gen) for s in ((t, k), (n, k), (n,), (t, n)))
    with FusionDefinition() as fd:
        x, w, b, r = fd.define_tensor([t, k]), fd.define_tensor([n, k]), fd.define_tensor([n]), fd.define_tensor([t, n])
        fd.add_output(fd.ops.add(r, fd.ops.linear(x, w, b)))
        for tv in (x, w):
            _shard(tv, mesh, 1)
        _shard(r, mesh, 0)
        b.set_device_mesh(mesh)
    inputs = [mesh.shard_tensor(ux, 1, rank), mesh.shard_tensor(uw, 1, rank), ub, mesh.shard_tensor(ur, 0, rank)]
    (out,), comms = _plan(fd, [i.to(dev) for i in inputs])
    partial = t * n * F32
    assert comms == _expect(d, ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d))
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(ur + F.linear(ux, uw, ub), 0, rank), rtol=RTOL, atol=ATOL)


def test_partial_read_split_and_summed_over_the_split_axis_is_reduce_scattered(multidevice_test):
    """The partial product is read by a row-split add and by a sum over the rows (a bias gradient):
    one ReduceScatter of the partial, then the sum runs on this rank's rows and an Allreduce of
    the [n] result completes it (instead of an Allreduce of the whole [t, n] product)."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    t, k, n = 4 * d, 4 * d, 6
    gen = torch.Generator().manual_seed(4)
    ux, uw, ur = (torch.randn(*s, generator=gen) for s in ((t, k), (n, k), (t, n)))
    with FusionDefinition() as fd:
        x, w, r = fd.define_tensor([t, k]), fd.define_tensor([n, k]), fd.define_tensor([t, n])
        y = fd.ops.linear(x, w)
        fd.add_output(fd.ops.add(r, y))
        fd.add_output(fd.ops.sum(y, [0]))
        for tv in (x, w):
            _shard(tv, mesh, 1)
        _shard(r, mesh, 0)
    inputs = [mesh.shard_tensor(ux, 1, rank), mesh.shard_tensor(uw, 1, rank), mesh.shard_tensor(ur, 0, rank)]
    (added, summed), comms = _plan(fd, [i.to(dev) for i in inputs])
    partial, column = t * n * F32, n * F32
    assert comms == _expect(d, ("ReduceScatter", (d - 1) * partial // d, (d - 1) * partial // d),
                            ("Allreduce", 2 * (d - 1) * column // d, 2 * (d - 1) * column // d))
    full = F.linear(ux, uw)
    torch.testing.assert_close(added.cpu(), mesh.shard_tensor(ur + full, 0, rank), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(summed.cpu(), full.sum(0), rtol=1e-5, atol=1e-4)
