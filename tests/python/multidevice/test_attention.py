"""Sharded attention (sdpfa_fwd + sdpfa_bwd) against unsharded PyTorch autograd: heads split by a
loop split or a logical split, and batch split, run with no communication; a sharded sequence is
gathered first (and an output annotated as sequence-sharded is sliced after), except the query's
without a causal mask, which stays split."""
import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds

TOL = dict(rtol=1e-5, atol=1e-5)


def _tol(test):
    """float32 on CUDA runs PyTorch's memory-efficient kernel: its sums run in another order."""
    return dict(rtol=1e-4, atol=1e-4) if test.device.type == "cuda" else TOL


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    return outputs, [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def _reference(shape, is_causal, seed=0):
    """Unsharded q, k, v, grad and PyTorch's attn, logsumexp, grad_q, grad_k, grad_v (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(shape, generator=g) for _ in range(4))
    leaf = [t.clone().requires_grad_() for t in (q, k, v)]
    attn = F.scaled_dot_product_attention(*leaf, is_causal=is_causal)
    attn.backward(grad)
    scores = (q.double() @ k.double().transpose(-1, -2)) / shape[-1] ** 0.5
    if is_causal:
        scores = scores.masked_fill(~torch.ones(shape[-2], shape[-2], dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(scores, -1).float()
    return (q, k, v, grad), (attn.detach(), lse, *(t.grad for t in leaf))


def _define(fd, shape, is_causal):
    q, k, v, grad = (fd.define_tensor(shape) for _ in range(4))
    attn, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=is_causal)
    grads = fd.ops.sdpfa_bwd(grad, q, k, v, attn, lse, 0.0, is_causal, seed, offset)
    outputs = [attn, lse, *grads]
    for t in outputs:
        fd.add_output(t)
    return [q, k, v, grad], outputs


def _check_local(test, mesh, inputs, expected, axis, shard_inputs, is_causal, kinds=()):
    """Runs the sharded program, compares each output with this rank's shard of PyTorch's result."""
    d = test.size
    shape = list(inputs[0].shape)
    with FusionDefinition() as fd:
        tvs, _ = _define(fd, shape, is_causal)
        for tv in tvs:
            shard_inputs(tv)
    outputs, comms = _communications(fd, [test.shard_tensor(t, axis, mesh) for t in inputs])
    assert communication_kinds(comms) == (list(kinds) if d > 1 else []), comms
    for name, actual, full in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], outputs, expected):
        torch.testing.assert_close(actual.cpu(), mesh.shard_tensor(full, axis, test.rank), **_tol(test),
                                   msg=lambda m: f"{name}: {m}")
    return fd


def test_heads_loop_split_is_local(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    inputs, expected = _reference([2, 2 * d, 6, 8], is_causal=True)

    def shard(tv):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)

    fd = _check_local(multidevice_test, mesh, inputs, expected, 1, shard, is_causal=True)
    assert "NoOp" not in fd.host_program() and "Allgather" not in fd.host_program(), fd.host_program()
    assert [s.axis_sharded_on(ParallelType.mesh_x) for s in fd.get_output_shardings()] == [1] * 5


def test_grouped_query_heads_split_is_local(multidevice_test):
    """q with 2 heads per key/value head, both head axes split over the mesh: each rank holds whole
    groups (its q heads read only its k/v heads), so nothing moves."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    g = torch.Generator().manual_seed(3)
    q, grad = (torch.randn(2, 4 * d, 6, 8, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 2 * d, 6, 8, generator=g) for _ in range(2))
    leaf = [t.clone().requires_grad_() for t in (q, k, v)]
    attn = F.scaled_dot_product_attention(*leaf, is_causal=True, enable_gqa=True)
    attn.backward(grad)
    expected = [attn.detach(), *(t.grad for t in leaf)]
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (fd.define_tensor(list(t.shape)) for t in (q, k, v, grad))
        a, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=True)
        grads = fd.ops.sdpfa_bwd(tg, tq, tk, tv, a, lse, 0.0, True, seed, offset)
        for t in [a, *grads]:
            fd.add_output(t)
        for t in (tq, tk, tv, tg):
            t.set_device_mesh(mesh)
            t.outer_split(1, d)
            t.axis(1).parallelize(ParallelType.mesh_x)
    outputs, comms = _communications(fd, [multidevice_test.shard_tensor(t, 1, mesh) for t in (q, k, v, grad)])
    assert communication_kinds(comms) == [], comms
    for name, actual, full in zip(["attn", "grad_q", "grad_k", "grad_v"], outputs, expected):
        torch.testing.assert_close(actual.cpu(), mesh.shard_tensor(full, 1, multidevice_test.rank),
                                   **_tol(multidevice_test), msg=lambda m: f"{name}: {m}")


def test_batch_loop_split_is_local(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    inputs, expected = _reference([d, 3, 5, 4], is_causal=False, seed=1)

    def shard(tv):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)

    _check_local(multidevice_test, mesh, inputs, expected, 0, shard, is_causal=False)


def test_heads_logical_split_is_local(multidevice_test):
    """nvFuser's test_sdpa layout: [d, b, h/d, s, e] with the device axis first."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    b, h, s, e = 2, 2 * d, 4, 8
    (q, k, v, grad), expected = _reference([b, h, s, e], is_causal=True, seed=2)

    def by_device(t):  # [b, h, ...] -> [d, b, h/d, ...]
        return t.reshape(b, d, h // d, *t.shape[2:]).transpose(0, 1).contiguous()

    with FusionDefinition() as fd:
        tvs, _ = _define(fd, [d, b, h // d, s, e], is_causal=True)
        for tv in tvs:
            tv.set_device_mesh(mesh)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    local = [by_device(t)[multidevice_test.rank:multidevice_test.rank + 1] for t in (q, k, v, grad)]
    outputs, comms = _communications(fd, local)
    assert comms == [], comms
    for name, actual, full in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], outputs, expected):
        want = by_device(full)[multidevice_test.rank:multidevice_test.rank + 1]
        torch.testing.assert_close(actual.cpu(), want, **_tol(multidevice_test), msg=lambda m: f"{name}: {m}")


def test_sequence_split_is_gathered_first(multidevice_test):
    """q, k, v and grad split on the sequence: the softmax needs whole rows, so each is gathered
    (one Allgather each: the backward shares the forward's gathers of q, k and v) and the outputs
    come out replicated."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    inputs, expected = _reference([1, 2, 2 * d, 4], is_causal=True, seed=3)
    with FusionDefinition() as fd:
        tvs, outs = _define(fd, [1, 2, 2 * d, 4], is_causal=True)
        for tv in tvs:
            tv.set_device_mesh(mesh)
            tv.outer_split(2, d)
            tv.axis(2).parallelize(ParallelType.mesh_x)
    outputs, comms = _communications(fd, [multidevice_test.shard_tensor(t, 2, mesh) for t in inputs])
    assert communication_kinds(comms) == (["Allgather"] * 4 if d > 1 else []), comms
    for actual, full in zip(outputs, expected):
        torch.testing.assert_close(actual.cpu(), full, **_tol(multidevice_test))


def test_sequence_sharded_output_is_sliced_after(multidevice_test):
    """An attention output annotated as split on the sequence is computed whole, then sliced
    locally (a LocalSlice: no data moves): the op itself never runs on a split sequence."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    inputs, expected = _reference([1, 2, 2 * d, 4], is_causal=True, seed=4)
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor([1, 2, 2 * d, 4]) for _ in range(3))
        attn, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)
        fd.add_output(attn)
        fd.add_output(lse)
        for tv in (q, k, v, lse):
            tv.set_device_mesh(mesh)
        attn.set_device_mesh(mesh)
        attn.outer_split(2, d)
        attn.axis(2).parallelize(ParallelType.mesh_x)
    outputs, comms = _communications(fd, [t.to(multidevice_test.device) for t in inputs[:3]])
    assert communication_kinds(comms) == (["LocalSlice"] if d > 1 else []), comms
    torch.testing.assert_close(outputs[0].cpu(), mesh.shard_tensor(expected[0], 2, multidevice_test.rank), **_tol(multidevice_test))
    torch.testing.assert_close(outputs[1].cpu(), expected[1], **_tol(multidevice_test))


def test_batch_on_mesh_y_and_heads_on_mesh_x_is_local(multidevice_test):
    """A 2-D mesh (2 x d/2 when d is even, else 1 x d): batch split on mesh_y, heads on mesh_x."""
    d = multidevice_test.size
    rows = 2 if d % 2 == 0 else 1
    cols = d // rows
    mesh = DeviceMesh(torch.arange(d).view(rows, cols))
    shape = [2 * rows, 2 * cols, 4, 8]
    inputs, expected = _reference(shape, is_causal=True, seed=5)
    with FusionDefinition() as fd:
        tvs, _ = _define(fd, shape, is_causal=True)
        for tv in tvs:
            tv.set_device_mesh(mesh)
            tv.outer_split(1, cols)
            tv.axis(1).parallelize(ParallelType.mesh_x)
            tv.outer_split(0, rows)
            tv.axis(0).parallelize(ParallelType.mesh_y)
    row, col = divmod(multidevice_test.rank, cols)

    def local(t):
        return t.chunk(rows, 0)[row].chunk(cols, 1)[col].contiguous()

    outputs, comms = _communications(fd, [local(t).to(multidevice_test.device) for t in inputs])
    assert comms == [], comms
    for name, actual, full in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], outputs, expected):
        torch.testing.assert_close(actual.cpu(), local(full), **_tol(multidevice_test), msg=lambda m: f"{name}: {m}")


def test_query_sequence_split_without_causal_mask_stays_split(multidevice_test):
    """Without a causal mask each query row is independent: q keeps its sequence split (attn and
    logsumexp come out split the same way) and only k and v are gathered."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    shape = [2, 2, 2 * d, 4]
    inputs, expected = _reference(shape, is_causal=False, seed=6)
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor(shape) for _ in range(3))
        attn, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v)
        fd.add_output(attn)
        fd.add_output(lse)
        for tv in (q, k, v):
            tv.set_device_mesh(mesh)
            tv.outer_split(2, d)
            tv.axis(2).parallelize(ParallelType.mesh_x)
    outputs, comms = _communications(fd, [multidevice_test.shard_tensor(t, 2, mesh) for t in inputs[:3]])
    assert communication_kinds(comms) == (["Allgather"] * 2 if d > 1 else []), comms
    assert [s.axis_sharded_on(ParallelType.mesh_x) for s in fd.get_output_shardings()] == [2, 2]
    for actual, full in zip(outputs, expected[:2]):
        torch.testing.assert_close(actual.cpu(), mesh.shard_tensor(full, 2, multidevice_test.rank), **_tol(multidevice_test))
