"""GPT block training step on 1-4 ranks: meshfuser's own forward saves the activations, its backward
definition reads them (examples/transformer_blocks.py), and every gradient equals unsharded PyTorch
autograd. TP: forward two Allreduce, backward two (the q, k and v input gradients summed before theirs).
SP: the backward mirrors the forward (an Allgather of the gradient before each row-parallel
linear's backward, one ReduceScatter of each column-parallel part's input gradient, q + k + v summed
first) plus an Allreduce of each LayerNorm weight and bias gradient, partial per sequence shard."""
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


def _reference_step(full, h, dy):
    params = {n: t.clone().requires_grad_() for n, t in full.items()}
    out = blocks.gpt_reference(params, h)
    out.backward(dy)
    return out.detach(), {n: t.grad for n, t in params.items()}


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_gpt_block_forward_then_backward_from_saved_activations(multidevice_test, form):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, h, hd = 2, 2 * d, 2 * d, 4
    e = h * hd
    full = blocks.gpt_parameters(b, s, e, seed=3)
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(4))
    expected_out, expected_grads = _reference_step(full, h, dy)
    local = {n: t.to(multidevice_test.device) for n, t in blocks.gpt_shard(full, form, d, rank).items()}
    x = local.pop("x")
    sp = form == "sp"

    forward = blocks.gpt_forward_definition(b, s, h, hd, d, form)
    with meshfuser.Profiler() as prof:
        outputs = forward.execute(blocks.gpt_forward_inputs(x, local))
    assert blocks.communications(prof.profile) == (FORWARD_COMMS[form] if d > 1 else [])
    assert len(outputs) == 1 + len(blocks.GPT_SAVED)
    shard_seq = (lambda t: mesh.shard_tensor(t, 1, rank)) if sp else (lambda t: t)  # noqa: E731
    torch.testing.assert_close(outputs[0].cpu(), shard_seq(expected_out), **TOL)
    # The saved activations have the shapes the backward expects: heads (merged, as the projections
    # write them) and MLP features split, ln0/ln1 whole, res0 like the activations.
    saved = dict(zip(blocks.GPT_SAVED, outputs[1:]))
    assert saved["q"].shape == (b, s, e // d) and saved["attn"].shape == (b, s, e // d)
    assert saved["lse"].shape == (b, h // d, s) and saved["pre"].shape == (b, s, 4 * e // d)
    assert saved["ln0"].shape == (b, s, e) and saved["ln1"].shape == (b, s, e)
    assert saved["res0"].shape == (b, s // d if sp else s, e)

    backward = blocks.gpt_backward_definition(b, s, h, hd, d, form)
    dy_local = shard_seq(dy).to(multidevice_test.device)
    with meshfuser.Profiler() as prof:
        grads = backward.execute(blocks.gpt_backward_inputs(dy_local, outputs, x, local))
    comms = blocks.communications(prof.profile)
    if d == 1:
        assert comms == []
    elif form == "tp":
        # d_ln1, and the q, k and v input gradients added as partial sums first (sum_partials): two
        # Allreduces, as Megatron's backward, not one per column-parallel input gradient.
        assert comms == ["Allreduce"] * 2
    else:
        # MLP: gather dy, reduce-scatter d_ln1; attention: gather d_res0, reduce-scatter the sum of
        # the q/k/v input gradients (sum_partials); then the four LayerNorm weight/bias gradients.
        assert comms == ["Allgather", "ReduceScatter"] * 2 + ["Allreduce"] * 4
    split = blocks.GPT_SPLIT | ({"x": 1} if sp else {})
    for n, actual in zip(blocks.GPT_PARAMS, grads):
        want = expected_grads[n]
        if n in split:
            want = mesh.shard_tensor(want, split[n], rank)
        torch.testing.assert_close(actual.cpu(), want, **TOL, msg=lambda m: f"grad of {n}: {m}")


def test_gpt_block_forward_rejects_unknown_form():
    with pytest.raises(ValueError, match="form must be one of"):
        blocks.gpt_forward_definition(1, 2, 2, 2, 1, "pp")


def test_gpt_block_training_step_in_bfloat16(multidevice_test):
    """The dtype the GPU benchmark runs (statistics in float32 inside): output and gradients within
    bfloat16 rounding of float32 autograd, relative to each tensor's largest entry or the incoming
    gradient's (the key bias gradient is zero up to rounding: softmax ignores a per-query shift)."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, h, hd = 1, 4 * d, 2 * d, 8
    e = h * hd
    full = blocks.gpt_parameters(b, s, e, seed=9, dtype=torch.bfloat16)
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    expected_out, expected_grads = _reference_step({n: t.float() for n, t in full.items()}, h, dy.float())
    local = {n: t.to(multidevice_test.device) for n, t in blocks.gpt_shard(full, "tp", d, rank).items()}
    x = local.pop("x")
    dtype = blocks.to_meshfuser_dtype(torch.bfloat16)
    outputs = blocks.gpt_forward_definition(b, s, h, hd, d, "tp", dtype).execute(blocks.gpt_forward_inputs(x, local))
    grads = blocks.gpt_backward_definition(b, s, h, hd, d, "tp", dtype).execute(
        blocks.gpt_backward_inputs(dy.to(multidevice_test.device), outputs, x, local))

    assert_bf16_step_close(outputs[0], grads, blocks.GPT_PARAMS, blocks.GPT_SPLIT, expected_out, expected_grads, dy,
                           mesh, rank)
