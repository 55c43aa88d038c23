"""Llama-style block training step on 1-4 ranks (examples/transformer_blocks.py): the forward saves
its activations (save=True), the backward definition reads them, and every gradient equals unsharded
PyTorch autograd, with grouped-query attention (2 query heads per key/value head, each rank holding
whole groups). TP: forward two Allreduces; backward two, each after summing partials (gate + up,
then q + k + v, the sum_partials pass), as Megatron's. SP: the backward mirrors the forward (an
Allgather of the gradient before each row-parallel linear's backward, one ReduceScatter of each
column-parallel part's summed input gradients) plus an Allreduce of each RMSNorm weight gradient."""
import pathlib
import sys

import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
import transformer_blocks as blocks  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from block_checks import assert_bf16_step_close  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TOL = dict(rtol=1e-4, atol=1e-4)
FORWARD_COMMS = {"tp": ["Allreduce"] * 2, "sp": ["Allgather", "ReduceScatter"] * 2}


def _sizes(d):
    """b, s, h, hd, ffn, kv_heads: 4 query heads and 2 key/value heads per rank."""
    return 2, 2 * d, 4 * d, 8, 12 * d, 2 * d


def _reference_step(full, h, dy):
    params = {n: t.clone().requires_grad_(n in blocks.LLAMA_GRADS) for n, t in full.items()}
    out = blocks.llama_reference(params, h)
    out.backward(dy)
    return out.detach(), {n: params[n].grad for n in blocks.LLAMA_GRADS}


def _bytes(comm_profiles):
    return [(c.name.split()[0], c.bytes_sent, c.bytes_received) for c in comm_profiles]


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_llama_block_forward_then_backward_from_saved_activations(multidevice_test, form):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, h, hd, ffn, kvh = _sizes(d)
    e = h * hd
    full = blocks.llama_parameters(b, s, e, hd, ffn, seed=7, kv_heads=kvh)
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(8))
    expected_out, expected_grads = _reference_step(full, h, dy)
    local = {n: t.to(multidevice_test.device) for n, t in blocks.llama_shard(full, form, d, rank).items()}
    x = local.pop("x")
    sp = form == "sp"
    shard_seq = (lambda t: mesh.shard_tensor(t, 1, rank)) if sp else (lambda t: t)  # noqa: E731

    forward = blocks.llama_forward_definition(b, s, h, hd, ffn, d, form, kv_heads=kvh, save=True)
    with meshfuser.Profiler() as prof:
        outputs = forward.execute(blocks.llama_forward_inputs(x, local))
    assert blocks.communications(prof.profile) == (FORWARD_COMMS[form] if d > 1 else [])
    assert len(outputs) == 1 + len(blocks.LLAMA_SAVED)
    torch.testing.assert_close(outputs[0].cpu(), shard_seq(expected_out), **TOL)
    saved = dict(zip(blocks.LLAMA_SAVED, outputs[1:]))
    # Heads stay merged as the projections wrote them, each rank holding whole key/value groups.
    assert saved["q"].shape == (b, s, e // d) and saved["k"].shape == (b, s, kvh * hd // d)
    assert saved["lse"].shape == (b, h // d, s) and saved["gate"].shape == (b, s, ffn // d)
    assert saved["normed0"].shape == (b, s, e) and saved["res0"].shape == (b, s // d if sp else s, e)

    backward = blocks.llama_backward_definition(b, s, h, hd, ffn, d, form, kv_heads=kvh)
    with meshfuser.Profiler() as prof:
        grads = backward.execute(blocks.llama_backward_inputs(shard_seq(dy).to(multidevice_test.device), outputs, x,
                                                              local))
    comms = [k for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    kinds = blocks.communications(prof.profile)
    # The partial sums (gate + up, q + k + v) are added by the GEMMs into the first partial's buffer
    # before their communication, on every mesh size and form (host/gemm_accumulate.cpp).
    assert backward.host_program().count("(gemm_accumulate)") == 3, backward.host_program()
    activation = b * s * e * 4  # float32 bytes of one whole [b, s, e] activation
    if d == 1:
        assert kinds == []
    elif form == "tp":
        # d_normed1 = gate + up partials, d_normed0 = q + k + v partials: one Allreduce each, of one
        # activation (a ring Allreduce sends and receives 2 (d-1)/d of it).
        assert kinds == ["Allreduce"] * 2, kinds
        for c in comms:
            assert c.bytes_sent == 2 * (d - 1) * activation // d, _bytes(comms)
    else:
        # MLP: gather dy, reduce-scatter gate + up input gradients; attention: gather d_res0,
        # reduce-scatter q + k + v ones (summed first); then the two RMSNorm weight gradients.
        assert kinds == ["Allgather", "ReduceScatter"] * 2 + ["Allreduce"] * 2, kinds
        for c, kind in zip(comms, kinds):
            if kind != "Allreduce":  # a gather receives, a scatter sends, (d-1)/d of an activation
                assert (c.bytes_received if kind == "Allgather" else c.bytes_sent) == (d - 1) * activation // d
            else:
                assert c.bytes_sent == 2 * (d - 1) * e * 4 // d, _bytes(comms)
    assert len(grads) == len(blocks.LLAMA_GRADS)
    split = blocks.LLAMA_SPLIT | ({"x": 1} if sp else {})
    for n, actual in zip(blocks.LLAMA_GRADS, grads):
        want = expected_grads[n]
        if n in split:
            want = mesh.shard_tensor(want, split[n], rank)
        torch.testing.assert_close(actual.cpu(), want, **TOL, msg=lambda m: f"grad of {n}: {m}")


def test_rope_backward_is_the_transpose_of_rope():
    """rotary_backward against autograd through rotate_half, in the [b, s, heads, hd] layout the
    block uses (tables broadcast as [s, 1, hd])."""
    b, s, heads, hd = 2, 4, 3, 8
    g = torch.Generator().manual_seed(9)
    t, dy = torch.randn(b, s, heads, hd, generator=g), torch.randn(b, s, heads, hd, generator=g)
    cos, sin = (c[:, None, :] for c in blocks.rope_tables(s, hd))
    leaf = t.clone().requires_grad_()
    half = hd // 2
    (leaf * cos + torch.cat([-leaf[..., half:], leaf[..., :half]], dim=-1) * sin).backward(dy)
    with meshfuser.FusionDefinition() as fd:
        tdy, tc, ts = fd.define_tensor([b, s, heads, hd]), fd.define_tensor([s, 1, hd]), fd.define_tensor([s, 1, hd])
        fd.add_output(blocks.rotary_backward(fd, tdy, tc, ts, hd))
    (out,) = fd.execute([dy, cos.contiguous(), sin.contiguous()])
    torch.testing.assert_close(out, leaf.grad, **TOL)


def test_llama_block_training_step_in_bfloat16(multidevice_test):
    """The dtype the GPU benchmark runs (RMSNorm statistics in float32 inside): output and gradients
    within bfloat16 rounding of float32 autograd, relative to each tensor's largest entry or the
    incoming gradient's, TP form."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, h, hd, ffn, kvh = 1, 4 * d, 4 * d, 8, 16 * d, 2 * d
    e = h * hd
    full = blocks.llama_parameters(b, s, e, hd, ffn, seed=11, dtype=torch.bfloat16, kv_heads=kvh)
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    expected_out, expected_grads = _reference_step({n: t.float() for n, t in full.items()}, h, dy.float())
    local = {n: t.to(multidevice_test.device) for n, t in blocks.llama_shard(full, "tp", d, rank).items()}
    x = local.pop("x")
    dtype = blocks.to_meshfuser_dtype(torch.bfloat16)
    outputs = blocks.llama_forward_definition(b, s, h, hd, ffn, d, "tp", dtype, kvh, save=True).execute(
        blocks.llama_forward_inputs(x, local))
    grads = blocks.llama_backward_definition(b, s, h, hd, ffn, d, "tp", dtype, kvh).execute(
        blocks.llama_backward_inputs(dy.to(multidevice_test.device), outputs, x, local))

    assert_bf16_step_close(outputs[0], grads, blocks.LLAMA_GRADS, blocks.LLAMA_SPLIT, expected_out, expected_grads, dy,
                           mesh, rank)
