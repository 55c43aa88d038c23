"""Overlap of communication with compute: ParallelType.stream loops (csrc/host/stream_loops.cpp,
csrc/runtime/run_stream_loop.cpp). Every decomposition against unsharded PyTorch and against the
same program without the stream schedule, for several chunk counts, with and without bias; the
printed loop, the communications each chunk posts and their bytes; and the errors."""
import re

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

pytestmark = pytest.mark.timeout(120)

RTOL, ATOL = 1e-5, 1e-4
F32 = 4
CHUNKS = [1, 2, 3, 8]


def _run(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    comms = [(k.name.split()[0], k.bytes_sent, k.bytes_received)
             for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    return outputs, comms


def _mesh_split(tv, mesh, axis, loop_axis=None):
    tv.set_device_mesh(mesh)
    tv.split(axis, mesh.size, False)
    tv.axis(axis if loop_axis is None else loop_axis).parallelize(ParallelType.mesh_x)


def _row_parallel(d, m, n, k, bias, chunks=None, ring=False):
    """x [m, d*k] and w [n, d*k] split on k; out [m, n] reduce-scattered on its rows. `chunks`:
    the output's rows inside each device's block cut into stream chunks; `ring`: x's rows cut into
    d stream chunks visited in ring order."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, d * k])
        w = fd.define_tensor([n, d * k])
        b = fd.define_tensor([n]) if bias else None
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        for tv in (x, w, out):
            _mesh_split(tv, mesh, -1, -2)
        if b is not None:
            b.set_device_mesh(mesh)
        out.outer_split(0, d)
        out.axis(0).parallelize(ParallelType.mesh_x)
        if chunks is not None:
            out.outer_split(1, chunks)
            out.axis(1).parallelize(ParallelType.stream)
        if ring:
            x.outer_split(0, d)
            x.axis(0).parallelize(ParallelType.stream)
            x.swizzle1d(0, ParallelType.mesh_x)
    return fd, mesh


def _gathered_column_parallel(d, m, n, k, bias, chunks=None, ring=False, broadcast=False):
    """x [m, k] sharded on its rows (sequence parallel), gathered, times w [n, k] split on n."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([n, k])
        b = fd.define_tensor([n]) if bias else None
        xg = fd.ops.set(x)
        out = fd.ops.linear(xg, w, b)
        fd.add_output(out)
        for tv in (x, w) + ((b,) if bias else ()):
            _mesh_split(tv, mesh, 0)
        xg.set_device_mesh(mesh)
        xg.outer_split(0, d)
        if chunks is not None:
            xg.outer_split(1, chunks)
            xg.axis(1).parallelize(ParallelType.stream)
        if ring or broadcast:
            xg.axis(0).parallelize(ParallelType.stream)
        if ring:
            xg.swizzle1d(0, ParallelType.mesh_x)
    return fd, mesh


def _inputs_row_parallel(mesh, rank, dev, m, n, k, bias):
    d = mesh.size
    ux, uw, ub = torch.randn(m, d * k), torch.randn(n, d * k), torch.randn(n)
    inputs = [mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)]
    if bias:
        inputs.append(ub.to(dev))
    expected = mesh.shard_tensor(F.linear(ux, uw, ub if bias else None), 0, rank)
    return inputs, expected


def _inputs_column_parallel(mesh, rank, dev, m, n, k, bias):
    ux, uw, ub = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    inputs = [mesh.shard_tensor(ux, 0, rank).to(dev), mesh.shard_tensor(uw, 0, rank).to(dev)]
    if bias:
        inputs.append(mesh.shard_tensor(ub, 0, rank).to(dev))
    expected = mesh.shard_tensor(F.linear(ux, uw, ub if bias else None), 1, rank)
    return inputs, expected


def _loop_header(fd):
    return re.findall(r"stream loop \d+: (.*) \{", fd.host_program())


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("chunks", CHUNKS)
def test_gemm_reduce_scatter_chunked(multidevice_test, chunks, bias):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d * chunks, 6, 4
    inputs, expected = _inputs_row_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, bias)
    fd, _ = _row_parallel(d, m, n, k, bias, chunks=chunks)
    (out,), comms = _run(fd, inputs)
    plain, _ = _row_parallel(d, m, n, k, bias)
    (plain_out,) = plain.execute(inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out, plain_out, rtol=RTOL, atol=ATOL)

    assert _loop_header(fd) == [f"GEMM+ReduceScatter over {chunks} chunks of rows [{d} blocks][{chunks} chunks]"
                                f"[rows/{d * chunks}] (stream axis of {_name(fd, 'output', 0)} axis 0)"]
    # Each chunk reduce-scatters its [m/chunks, n] partial rows: 1/chunks of the plain plan's bytes.
    per_chunk = (d - 1) * (m // chunks) * n * F32 // d
    assert comms == ([("ReduceScatter", per_chunk, per_chunk)] * chunks if d > 1 else [])
    if d > 1:
        text = fd.host_program()
        assert f"bytes per chunk: sent={per_chunk} received={per_chunk}" in text, text
        assert f"total bytes: sent={per_chunk * chunks} received={per_chunk * chunks}" in text, text
        assert "post 0: " not in text  # no plain ReduceScatter left outside the loop


def _name(fd, kind, i):
    """The printed name of a fusion input/output (T3, ...)."""
    tv = fd.fusion.output(i) if kind == "output" else fd.fusion.input(i)
    return repr(tv)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("chunks", CHUNKS)
def test_allgather_gemm_chunked(multidevice_test, chunks, bias):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d * chunks, 3 * d, 5
    inputs, expected = _inputs_column_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, bias)
    fd, _ = _gathered_column_parallel(d, m, n, k, bias, chunks=chunks)
    (out,), comms = _run(fd, inputs)
    plain, _ = _gathered_column_parallel(d, m, n, k, bias)
    (plain_out,) = plain.execute(inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out, plain_out, rtol=RTOL, atol=ATOL)

    header = _loop_header(fd)
    assert len(header) == 1 and header[0].startswith(
        f"Allgather+GEMM over {chunks} chunks of rows [{d} blocks][{chunks} chunks]"), fd.host_program()
    # Each chunk gathers every member's [m/(d*chunks), k] rows of x.
    per_chunk = (d - 1) * (m // (d * chunks)) * k * F32
    assert comms == ([("Allgather", per_chunk, per_chunk)] * chunks if d > 1 else [])
    if d > 1:
        assert f"bytes per chunk: sent={per_chunk} received={per_chunk}" in fd.host_program()


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_allgather_gemm_ring(multidevice_test, bias):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 3 * d, 2 * d, 4
    inputs, expected = _inputs_column_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, bias)
    fd, _ = _gathered_column_parallel(d, m, n, k, bias, ring=True)
    (out,), comms = _run(fd, inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)

    header = _loop_header(fd)
    assert len(header) == 1 and header[0].startswith(f"ring Allgather+GEMM over {d} chunks"), fd.host_program()
    # Each step passes the [m/d, k] shard held to the next rank: 1/d of the data per step.
    shard = (m // d) * k * F32
    assert comms == [("SendRecv", shard, shard)] * (d - 1)
    if d > 1:
        assert f"bytes per step: sent={shard} received={shard}" in fd.host_program()


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_allgather_gemm_broadcast(multidevice_test, bias):
    """Stream chunks that are whole device shards, without swizzle: chunk j is member j's shard,
    broadcast to the team (nvFuser's "broadcast" form)."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d, 2 * d, 3
    inputs, expected = _inputs_column_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, bias)
    fd, _ = _gathered_column_parallel(d, m, n, k, bias, broadcast=True)
    (out,), comms = _run(fd, inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    kind = "Broadcast+GEMM" if d > 1 else "Allgather+GEMM"
    assert _loop_header(fd)[0].startswith(f"{kind} over {d} chunks"), fd.host_program()
    assert [c[0] for c in comms] == (["Broadcast"] * d if d > 1 else [])


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_gemm_reduce_scatter_ring(multidevice_test, bias):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d, 5, 3
    inputs, expected = _inputs_row_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, bias)
    fd, _ = _row_parallel(d, m, n, k, bias, ring=True)
    (out,), comms = _run(fd, inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert _loop_header(fd)[0].startswith(f"ring GEMM+ReduceScatter over {d} chunks"), fd.host_program()
    # Each step passes one [m/d, n] block of running sums on.
    block = (m // d) * n * F32
    assert comms == [("SendRecv", block, block)] * (d - 1)


@pytest.mark.parametrize("chunks", [2, 3])
def test_gemm_allreduce_chunked(multidevice_test, chunks):
    """nvFuser's row-parallel form: the input's rows cut into stream chunks, each chunk's partial
    product all-reduced."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * chunks, 4, 3
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, d * k])
        w = fd.define_tensor([n, d * k])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            _mesh_split(tv, mesh, -1, -2)
        x.outer_split(0, chunks)
        x.axis(0).parallelize(ParallelType.stream)
    ux, uw = torch.randn(m, d * k), torch.randn(n, d * k)
    (out,), comms = _run(fd, [mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)])
    torch.testing.assert_close(out.cpu(), F.linear(ux, uw), rtol=RTOL, atol=ATOL)
    assert _loop_header(fd)[0].startswith(f"GEMM+Allreduce over {chunks} chunks of rows [1 blocks]")
    per_chunk = 2 * (d - 1) * (m // chunks) * n * F32 // d
    assert comms == ([("Allreduce", per_chunk, per_chunk)] * chunks if d > 1 else [])


def _sequence_parallel_mlp(d, t, h, f, chunks=None, overlap=None):
    """x [t, h] sharded on the sequence -> Allgather -> linear(w1 [f, h] split on f) -> gelu ->
    linear(w2 [h, f] split on f) -> ReduceScatter back onto the sequence."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition(overlap=overlap) as fd:
        x = fd.define_tensor([t, h])
        w1 = fd.define_tensor([f, h])
        b1 = fd.define_tensor([f])
        w2 = fd.define_tensor([h, f])
        b2 = fd.define_tensor([h])
        xg = fd.ops.set(x)
        y = fd.ops.gelu(fd.ops.linear(xg, w1, b1))
        out = fd.ops.linear(y, w2, b2)
        fd.add_output(out)
        _mesh_split(x, mesh, 0)
        _mesh_split(w1, mesh, 0)
        _mesh_split(b1, mesh, 0)
        _mesh_split(w2, mesh, -1, -2)
        _mesh_split(out, mesh, -1, -2)
        b2.set_device_mesh(mesh)
        xg.set_device_mesh(mesh)
        out.outer_split(0, d)
        out.axis(0).parallelize(ParallelType.mesh_x)
        if chunks is not None:
            xg.outer_split(0, d)
            xg.outer_split(1, chunks)
            xg.axis(1).parallelize(ParallelType.stream)
            out.outer_split(1, chunks)
            out.axis(1).parallelize(ParallelType.stream)
    return fd, mesh


def _mlp_inputs(mesh, rank, dev, t, h, f):
    ux, uw1, ub1, uw2, ub2 = (torch.randn(t, h), torch.randn(f, h), torch.randn(f), torch.randn(h, f),
                              torch.randn(h))
    inputs = [mesh.shard_tensor(ux, 0, rank), mesh.shard_tensor(uw1, 0, rank), mesh.shard_tensor(ub1, 0, rank),
              mesh.shard_tensor(uw2, 1, rank), ub2]
    expected = F.linear(F.gelu(F.linear(ux, uw1, ub1)), uw2, ub2)
    return [i.to(dev) for i in inputs], mesh.shard_tensor(expected, 0, rank)


@pytest.mark.parametrize("chunks", CHUNKS)
def test_sequence_parallel_mlp(multidevice_test, chunks):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, h, f = 2 * d * chunks, 6, 4 * d
    fd, mesh = _sequence_parallel_mlp(d, t, h, f, chunks)
    inputs, expected = _mlp_inputs(mesh, rank, dev, t, h, f)
    (out,), comms = _run(fd, inputs)
    plain, _ = _sequence_parallel_mlp(d, t, h, f)
    (plain_out,) = plain.execute(inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out, plain_out, rtol=RTOL, atol=ATOL)
    headers = _loop_header(fd)
    assert [h_.split(" over ")[0] for h_ in headers] == ["Allgather+GEMM", "GEMM+ReduceScatter"], fd.host_program()
    kinds = [c[0] for c in comms]
    assert kinds == (["Allgather"] * chunks + ["ReduceScatter"] * chunks if d > 1 else [])


@pytest.mark.parametrize("mode", ["ring", "chunked", "auto"])
def test_overlap_option(multidevice_test, mode):
    """The option overlaps the linears of a program written without any stream schedule."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, h, f = 8 * d, 6, 2 * d
    fd, mesh = _sequence_parallel_mlp(d, t, h, f, overlap=mode)
    inputs, expected = _mlp_inputs(mesh, rank, dev, t, h, f)
    (out,), comms = _run(fd, inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert fd.overlap == mode
    headers = [h_.split(" over ")[0] for h_ in _loop_header(fd)]
    kinds = [c[0] for c in comms]
    if d == 1:
        assert headers == [] and kinds == []  # nothing to overlap on one device
    elif mode == "chunked":
        assert headers == ["Allgather+GEMM", "GEMM+ReduceScatter"], fd.host_program()
        assert kinds == ["Allgather"] * 4 + ["ReduceScatter"] * 4  # t/d = 8 rows per device: 4 chunks
    else:
        assert headers == ["ring Allgather+GEMM", "ring GEMM+ReduceScatter"], fd.host_program()
        assert kinds == ["SendRecv"] * (2 * (d - 1))
    assert "(overlap option)" in fd.host_program() or d == 1


def test_overlap_option_chunks_shrink_to_divide(multidevice_test):
    """The option's chunk count (4) shrinks to one that divides the rows: 3 rows per device -> 3."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, h, f = 3 * d, 4, 2 * d
    fd, mesh = _sequence_parallel_mlp(d, t, h, f, overlap="chunked")
    inputs, expected = _mlp_inputs(mesh, rank, dev, t, h, f)
    (out,), comms = _run(fd, inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert [c[0] for c in comms] == (["Allgather"] * 3 + ["ReduceScatter"] * 3 if d > 1 else [])
    if d > 1:
        assert [h_.split(" of rows")[0] for h_ in _loop_header(fd)] == ["Allgather+GEMM over 3 chunks",
                                                                       "GEMM+ReduceScatter over 3 chunks"]
        per_chunk = (d - 1) * 1 * h * F32  # one row of x from each other device
        assert f"bytes per chunk: sent={per_chunk} received={per_chunk}" in fd.host_program(), fd.host_program()


def test_overlap_option_keys_the_cache(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, h, f = 2 * d, 4, 2 * d
    fd, mesh = _sequence_parallel_mlp(d, t, h, f)
    inputs, expected = _mlp_inputs(mesh, rank, dev, t, h, f)
    fd.execute(inputs)
    assert "stream loop" not in fd.host_program()
    fd.overlap = "ring"
    (out,) = fd.execute(inputs)
    torch.testing.assert_close(out.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert ("stream loop" in fd.host_program()) == (d > 1)


def test_dtensor_compile_overlap(multidevice_test):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    d = multidevice_test.size
    dev = multidevice_test.device

    def mlp(fd):
        x = fd.define_tensor([-1, -1])
        w1 = fd.define_tensor([-1, -1])
        w2 = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, w1)), w2))

    tmesh = init_device_mesh(dev.type, (d,))
    ux, uw1, uw2 = torch.randn(4 * d, 8), torch.randn(4 * d, 8), torch.randn(8, 4 * d)
    x = distribute_tensor(ux.to(dev), tmesh, [Replicate()])
    w1 = distribute_tensor(uw1.to(dev), tmesh, [Shard(0)])
    w2 = distribute_tensor(uw2.to(dev), tmesh, [Shard(1)])
    expected = F.linear(F.gelu(F.linear(ux, uw1)), uw2)
    for mode in ["auto", "ring", "chunked", None]:
        f = meshfuser.dtensor.compile(mlp, overlap=mode)
        out = f(x, w1, w2)
        torch.testing.assert_close(out.full_tensor().cpu(), expected, rtol=RTOL, atol=ATOL)
        (fd,) = f.definitions()
        assert fd.overlap == mode
        # Column then row parallel: the partial product is all-reduced; "ring" has no ring for it.
        overlapped = d > 1 and mode in ("auto", "chunked")
        assert ("GEMM+Allreduce over 4 chunks" in fd.host_program()) == overlapped, fd.host_program()
    with pytest.raises(meshfuser.Error, match="overlap"):
        meshfuser.dtensor.compile(mlp, overlap="sometimes")



@pytest.mark.parametrize("form", ["chunks", "ring"])
def test_batched_sequence_axis(multidevice_test, form):
    """[batch, sequence, hidden]: the loops cut the sequence (axis 1), so every chunk is strided."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    B, S, K, N = 2, 4 * d, 3 * d, 5
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:  # row parallel, output scattered on the sequence
        x = fd.define_tensor([B, S, K])
        w = fd.define_tensor([N, K])
        b = fd.define_tensor([N])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        for tv in (x, w, out):
            _mesh_split(tv, mesh, -1, -2)
        b.set_device_mesh(mesh)
        out.outer_split(1, d)
        out.axis(1).parallelize(ParallelType.mesh_x)
        if form == "chunks":
            out.outer_split(2, 2)
            out.axis(2).parallelize(ParallelType.stream)
        else:
            x.outer_split(1, d)
            x.axis(1).parallelize(ParallelType.stream)
            x.swizzle1d(1, ParallelType.mesh_x)
    ux, uw, ub = torch.randn(B, S, K), torch.randn(N, K), torch.randn(N)
    (o,) = fd.execute([mesh.shard_tensor(ux, 2, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev), ub.to(dev)])
    torch.testing.assert_close(o.cpu(), mesh.shard_tensor(F.linear(ux, uw, ub), 1, rank), rtol=RTOL, atol=ATOL)
    assert len(_loop_header(fd)) == 1, fd.host_program()

    with FusionDefinition() as fd:  # sequence-sharded input gathered into a column-parallel linear
        x = fd.define_tensor([B, S, K])
        w = fd.define_tensor([N * d, K])
        xg = fd.ops.set(x)
        fd.add_output(fd.ops.linear(xg, w))
        _mesh_split(x, mesh, 1)
        _mesh_split(w, mesh, 0)
        xg.set_device_mesh(mesh)
        xg.outer_split(1, d)
        if form == "chunks":
            xg.outer_split(2, 2)
            xg.axis(2).parallelize(ParallelType.stream)
        else:
            xg.axis(1).parallelize(ParallelType.stream)
            xg.swizzle1d(1, ParallelType.mesh_x)
    ux, uw = torch.randn(B, S, K), torch.randn(N * d, K)
    (o,) = fd.execute([mesh.shard_tensor(ux, 1, rank).to(dev), mesh.shard_tensor(uw, 0, rank).to(dev)])
    torch.testing.assert_close(o.cpu(), mesh.shard_tensor(F.linear(ux, uw), 2, rank), rtol=RTOL, atol=ATOL)
    assert len(_loop_header(fd)) == 1, fd.host_program()


def test_nvfuser_row_parallel_schedule(multidevice_test):
    """nvFuser's row-parallel form: the input's rows split into stream chunks before its k axis is
    split over the mesh; the output left to propagation (replicated: one Allreduce per chunk)."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    h, s, t = 2, 3, 6
    if (4 * h) % d:
        pytest.skip(f"4h = {4 * h} does not split over {d} devices")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, 4 * h], dtype=meshfuser.DataType.BFloat16)
        weight = fd.define_tensor([h, 4 * h], dtype=meshfuser.DataType.BFloat16)
        fd.add_output(fd.ops.linear(inp, weight))
        inp.set_device_mesh(mesh)
        weight.set_device_mesh(mesh)
        inp.outer_split(0, s)
        inp.axis(0).parallelize(ParallelType.stream)
        inp.outer_split(2, d)
        inp.axis(2).parallelize(ParallelType.mesh_x)
        weight.outer_split(1, d)
        weight.axis(1).parallelize(ParallelType.mesh_x)
    # Small integers: every order of summation gives the exact bf16 result.
    inp_ref = torch.randint(-3, 4, (t, 4 * h)).to(torch.bfloat16)
    weight_ref = torch.randint(-3, 4, (h, 4 * h)).to(torch.bfloat16)
    ins = [meshfuser.shard_tensor(inp_ref, fd.fusion.input(0)).to(dev),
           meshfuser.shard_tensor(weight_ref, fd.fusion.input(1)).to(dev)]
    (out,), comms = _run(fd, ins)
    torch.testing.assert_close(out.cpu(), F.linear(inp_ref, weight_ref), rtol=0, atol=0)
    assert _loop_header(fd)[0].startswith(f"GEMM+Allreduce over {s} chunks"), fd.host_program()
    assert [c[0] for c in comms] == (["Allreduce"] * s if d > 1 else [])


@pytest.mark.parametrize("parallelism", ["collective_permute", "broadcast"])
def test_nvfuser_column_parallel_schedule(multidevice_test, parallelism):
    """nvFuser's column-parallel forms: the gathered input's rows split into one stream chunk per
    device, swizzled into the ring (send/recv) or not (one Broadcast per device)."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    h, t = 2, 24
    if (4 * h) % d or t % d:
        pytest.skip(f"{4 * h} and {t} must split over {d} devices")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, h], dtype=meshfuser.DataType.BFloat16)
        weight = fd.define_tensor([4 * h, h], dtype=meshfuser.DataType.BFloat16)
        ag_out = fd.ops.set(inp)
        fd.add_output(fd.ops.linear(ag_out, weight))
        for tv in (inp, weight):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
        ag_out.set_device_mesh(mesh)
        ag_out.outer_split(0, d)
        if parallelism == "collective_permute":
            ag_out.swizzle1d(0, ParallelType.mesh_x)
        ag_out.axis(0).parallelize(ParallelType.stream)
    inp_ref = torch.randint(-3, 4, (t, h)).to(torch.bfloat16)
    weight_ref = torch.randint(-3, 4, (4 * h, h)).to(torch.bfloat16)
    weight = meshfuser.shard_tensor(weight_ref, fd.fusion.input(1))
    (out,), comms = _run(fd, [meshfuser.shard_tensor(inp_ref, fd.fusion.input(0)).to(dev), weight.to(dev)])
    torch.testing.assert_close(out.cpu(), F.linear(inp_ref, weight), rtol=0, atol=0)
    kinds = [c[0] for c in comms]
    if parallelism == "collective_permute":
        assert kinds == ["SendRecv"] * (d - 1)
    else:
        assert kinds == (["Broadcast"] * d if d > 1 else [])


@pytest.mark.parametrize("s", [1, 2])
def test_nvfuser_allgather_stream_outermost(multidevice_test, s):
    """nvFuser's stream-outermost form: x [s, d, m/(s d), k] sharded on axis 1 (a logical split),
    the output's whole axis 0 on stream: each chunk gathers its own [d, m/(s d), k] slice."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, k, n = 4 * s * d, 6, 5
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([s, d, m // (s * d), k])
        w = fd.define_tensor([n, k])
        b = fd.define_tensor([n])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        for tv in (x, w, b, out):
            tv.set_device_mesh(mesh)
        x.axis(1).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.stream)
    ux, uw, ub = torch.randn(s, d, m // (s * d), k), torch.randn(n, k), torch.randn(n)
    (o,), comms = _run(fd, [ux[:, rank:rank + 1].to(dev), uw.to(dev), ub.to(dev)])
    torch.testing.assert_close(o.cpu(), F.linear(ux, uw, ub), rtol=RTOL, atol=ATOL)
    assert _loop_header(fd)[0].startswith(f"Allgather+GEMM over {s} chunks of rows [1 blocks]"), fd.host_program()
    per_chunk = (d - 1) * (m // (s * d)) * k * F32
    assert comms == ([("Allgather", per_chunk, per_chunk)] * s if d > 1 else [])


def test_nvfuser_allgather_shard_outermost(multidevice_test):
    """nvFuser's shard-outermost form: x [d, m/d, k] sharded on axis 0, the output's axis 0 on
    stream: chunk j is member j's shard (one Broadcast each)."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, k, n = 3 * d, 4, 5
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d, m // d, k])
        w = fd.define_tensor([n, k])
        b = fd.define_tensor([n])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        for tv in (x, w, b, out):
            tv.set_device_mesh(mesh)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.stream)
    ux, uw, ub = torch.randn(d, m // d, k), torch.randn(n, k), torch.randn(n)
    (o,), comms = _run(fd, [ux[rank:rank + 1].to(dev), uw.to(dev), ub.to(dev)])
    torch.testing.assert_close(o.cpu(), F.linear(ux, uw, ub), rtol=RTOL, atol=ATOL)
    assert [c[0] for c in comms] == (["Broadcast"] * d if d > 1 else [])


def test_gemm_reduce_scatter_chunks_of_the_batch(multidevice_test):
    """A stream on an axis the ReduceScatter does not scatter (the batch): each chunk reduce-scatters
    its whole slice."""
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    B, S, K, N = 4, 2 * d, 3 * d, 5
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([B, S, K])
        w = fd.define_tensor([N, K])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        for tv in (x, w, out):
            _mesh_split(tv, mesh, -1, -2)
        out.outer_split(1, d)
        out.axis(1).parallelize(ParallelType.mesh_x)
        out.outer_split(0, 2)
        out.axis(0).parallelize(ParallelType.stream)
    ux, uw = torch.randn(B, S, K), torch.randn(N, K)
    (o,), comms = _run(fd, [mesh.shard_tensor(ux, 2, rank).to(dev), mesh.shard_tensor(uw, 1, rank).to(dev)])
    torch.testing.assert_close(o.cpu(), mesh.shard_tensor(F.linear(ux, uw), 1, rank), rtol=RTOL, atol=ATOL)
    assert _loop_header(fd)[0].startswith("GEMM+ReduceScatter over 2 chunks of rows [1 blocks]"), fd.host_program()
    per_chunk = (d - 1) * (B // 2) * S * N * F32 // d
    assert comms == ([("ReduceScatter", per_chunk, per_chunk)] * 2 if d > 1 else [])

# -- errors -------------------------------------------------------------------------------------------

def test_error_uneven_chunks(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 4 * d, 6, 4  # 4 rows per device do not split into 3 chunks
    inputs, _ = _inputs_row_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, False)
    fd, _ = _row_parallel(d, m, n, k, False, chunks=3)
    out_name = _name(fd, "output", 0)
    with pytest.raises(meshfuser.Error, match=rf"{out_name} axis 0: extent {m} does not split into {d} blocks of 3 "
                                              r"stream chunks"):
        fd.execute(inputs)


def test_error_stream_on_weight(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d, 4, 4
    inputs, _ = _inputs_row_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, False)
    fd, _ = _row_parallel(d, m, n, k, False)
    w = fd.fusion.input(1)
    w.outer_split(0, 2)
    w.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(meshfuser.Error, match=rf"ParallelType.stream on {w!r} axis 0 cannot be streamed"):
        fd.execute(inputs)


def test_error_stream_on_output_columns(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 2 * d, 4, 4
    inputs, _ = _inputs_row_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, False)
    fd, _ = _row_parallel(d, m, n, k, False)
    out = fd.fusion.output(0)
    out.outer_split(2, 2)  # [DIDx, m/d, 2, n/2, ...]: the columns
    out.axis(2).parallelize(ParallelType.stream)
    with pytest.raises(meshfuser.Error, match=rf"{out!r} axis 1 cannot be streamed: .* runs over its rows, which "
                                              r"are axis 0"):
        fd.execute(inputs)


def test_error_chunks_outside_device_blocks(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d == 1:
        pytest.skip("one device: every split holds the one block")
    m, n, k = 4 * d, 2 * d, 4
    inputs, _ = _inputs_column_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, False)
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([n, k])
        xg = fd.ops.set(x)
        fd.add_output(fd.ops.linear(xg, w))
        _mesh_split(x, mesh, 0)
        _mesh_split(w, mesh, 0)
        xg.set_device_mesh(mesh)
        xg.outer_split(0, 4 * d)  # chunks of the whole sequence, not inside each device's block
        xg.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(meshfuser.Error, match=rf"split the axis by the team size {d} first"):
        fd.execute(inputs)


def test_error_ring_needs_one_chunk_per_member(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, n, k = 4 * d, 2 * d, 4
    inputs, _ = _inputs_column_parallel(DeviceMesh(range(d)), rank, dev, m, n, k, False)
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([n, k])
        xg = fd.ops.set(x)
        fd.add_output(fd.ops.linear(xg, w))
        _mesh_split(x, mesh, 0)
        _mesh_split(w, mesh, 0)
        xg.set_device_mesh(mesh)
        xg.outer_split(0, 2 * d)
        xg.axis(0).parallelize(ParallelType.stream)
        xg.swizzle1d(0, ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match=rf"a ring \(swizzle1d\) visits one chunk per team member: split the "
                                              rf"rows straight into {d} stream chunks"):
        fd.execute(inputs)


def test_error_swizzle_without_stream(multidevice_test):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 4])
        fd.add_output(fd.ops.relu(x))
        x.outer_split(0, 2)
        x.swizzle1d(0, ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match="swizzled .* but not parallelized on ParallelType.stream"):
        fd.execute([torch.randn(4, 4)])
    with pytest.raises(meshfuser.Error, match="swizzle1d: .* mesh axis"):
        x.swizzle1d(0, ParallelType.stream)


def test_error_unknown_overlap_mode():
    with pytest.raises(meshfuser.Error, match=r'overlap: expected None, "auto", "ring" or "chunked"; got "fast"'):
        FusionDefinition(overlap="fast")
    with pytest.raises(meshfuser.Error, match="overlap"):
        FusionDefinition(overlap=True)
