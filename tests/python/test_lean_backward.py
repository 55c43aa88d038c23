"""The GPT and Llama-style block backwards (examples/transformer_blocks.py) move no data outside the
GEMMs, attention and generated kernels: the saved q, k, v and attention output keep the projections'
[b, s, heads * head_dim] layout, so splitting and merging heads are views, the attention kernels read
and write that layout in place, and the weight gradients' GEMMs read their operands transposed in
place (a layout flag, not a copy).

The forward that saves those activations copies nothing to save them either. Two independent
checks each: the GPU plan, walked on meta tensors (fd.cuda_kernels, no GPU needed): every piece on
ATen is a GEMM, attention, views or RoPE's cat; and a CPU run under torch.profiler: no aten::copy_
(exceptions, each named where it is allowed: grouped-query attention repeats the key/value heads
inside the attention op, a biased GEMM starts from its bias, the CPU kernel's logsumexp layout)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from meshfuser import DataType

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import transformer_blocks as blocks  # noqa: E402

pytestmark = pytest.mark.timeout(120)
B, S, H, HD, FFN, KV_HEADS = 2, 8, 4, 8, 48, 2
PIECE = re.compile(r"piece \d+ \[(.*)\]: (generated|ATen) ?(.*)$")


def _gpt():
    e = H * HD
    full = blocks.gpt_parameters(B, S, e, seed=1)
    x = full.pop("x")
    outputs = blocks.gpt_forward_definition(B, S, H, HD, 1, "tp").execute(blocks.gpt_forward_inputs(x, full))
    inputs = blocks.gpt_backward_inputs(torch.randn(B, S, e), outputs, x, full)
    return inputs, lambda dtype: blocks.gpt_backward_definition(B, S, H, HD, 1, "tp", dtype)


def _llama():
    e = H * HD
    full = blocks.llama_parameters(B, S, e, HD, FFN, seed=2, kv_heads=KV_HEADS)
    x = full.pop("x")
    forward = blocks.llama_forward_definition(B, S, H, HD, FFN, 1, "tp", kv_heads=KV_HEADS, save=True)
    outputs = forward.execute(blocks.llama_forward_inputs(x, full))
    inputs = blocks.llama_backward_inputs(torch.randn(B, S, e), outputs, x, full)
    return inputs, lambda dtype: blocks.llama_backward_definition(B, S, H, HD, FFN, 1, "tp", dtype, KV_HEADS)


# GEMMs (two per linear), RoPE'd tensors, sums of input-gradient partials that GEMMs accumulate
# (GPT: q + k + v; Llama: gate + up, q + k + v)
BLOCKS = {"gpt": (_gpt, 12, 0, 2), "llama": (_llama, 14, 2, 3)}


def _gpu_plan(backward, inputs, lse):
    """(ops, runs_on, why) per piece of the backward's plan for bfloat16 CUDA tensors."""
    meta = [torch.empty_like(t, device="meta", dtype=torch.bfloat16 if t.is_floating_point() and i != lse
                             else t.dtype) for i, t in enumerate(inputs)]  # attention's lse stays float32
    backward.cuda_kernels(meta)
    pieces = [PIECE.search(line.strip()) for line in backward.host_program().splitlines()]
    return [(m.group(1).split(", "), m.group(2), m.group(3)) for m in pieces if m]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_backward_plan_has_no_copies(block):
    make, linears_gemms, rotated, accumulating_sums = BLOCKS[block]
    inputs, definition = make()
    saved = blocks.GPT_SAVED if block == "gpt" else blocks.LLAMA_SAVED
    plan = _gpu_plan(definition(DataType.BFloat16), inputs, 1 + saved.index("lse"))
    aten = [(ops, why) for ops, runs_on, why in plan if runs_on == "ATen"]
    # A GEMM adding into the partial sum of input gradients (host/gemm_accumulate.cpp) is one piece.
    gemm_pieces = (["matmul"], ["matmul", "add"])
    gemms = [ops for ops, _ in aten if ops in gemm_pieces]
    accumulating = [ops for ops, _ in aten if ops == ["matmul", "add"]]
    attention = [ops for ops, _ in aten if ops == ["sdpfa_bwd"]]
    views = [ops for ops, why in aten if why.startswith("(only views")]
    assert len(gemms) == linears_gemms and len(attention) == 1, plan
    assert len(accumulating) == accumulating_sums, plan
    rest = [(ops, why) for ops, why in aten
            if ops not in (*gemm_pieces, ["sdpfa_bwd"]) and not why.startswith("(only views")]
    # RoPE's rotate_half transpose concatenates the halves: one cat per rotated tensor (q, k) until
    # cat runs inside the generated kernels; nothing else leaves them.
    assert all(ops == ["cat"] for ops, _ in rest) and len(rest) <= rotated, rest
    assert views and all(set(ops) <= {"reshape", "permute", "slice", "broadcast_in_dim"} for ops in views), views
    # The bias and norm-weight gradients are generated reductions.
    assert any(runs_on == "generated" and "sum" in ops for ops, runs_on, _ in plan), plan


def _forward(block, dtype):
    """The training forward (saving activations) and its inputs."""
    e = H * HD
    if block == "gpt":
        full = blocks.gpt_parameters(B, S, e, seed=1)
        return blocks.gpt_forward_definition(B, S, H, HD, 1, "tp", dtype), blocks.gpt_forward_inputs(full.pop("x"), full)
    full = blocks.llama_parameters(B, S, e, HD, FFN, seed=2, kv_heads=KV_HEADS)
    forward = blocks.llama_forward_definition(B, S, H, HD, FFN, 1, "tp", dtype, KV_HEADS, save=True)
    return forward, blocks.llama_forward_inputs(full.pop("x"), full)


def _cpu_copies(fd, inputs, allowed):
    """The aten::copy_ calls of one CPU run of fd (after a warm one), but those `allowed(shape,
    enclosing op names)` excuses; 0-d copies are scalars wrapped for ATen calls."""
    fd.execute(inputs)  # plans and compiles outside the profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fd.execute(inputs)
    copies = []
    for event in prof.events():
        if event.name != "aten::copy_" or not event.input_shapes or not event.input_shapes[0]:
            continue
        outer = []
        parent = event.cpu_parent
        while parent is not None:
            outer.append(parent.name)
            parent = parent.cpu_parent
        if not allowed(event.input_shapes[0], outer):
            copies.append((event.input_shapes[0], outer[:3]))
    return copies


def _grouped_heads_repeat(block, op):
    """Grouped-query attention repeats the key/value heads for the kernel, inside the attention op."""
    return lambda shape, outer: block == "llama" and any(op in name for name in outer)


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_training_forward_saves_without_copies(block):
    """The forward that saves the activations: its outputs are what the projections and attention
    wrote (heads merged), so saving them copies nothing either. GPU plan: GEMMs, attention, views,
    RoPE's cat; CPU run: no copy but the logsumexp, which PyTorch's CPU flash kernel writes as
    [b, s, h] (CUDA's kernels write the [b, h, s] we save)."""
    forward, inputs = _forward(block, DataType.BFloat16)
    plan = _gpu_plan(forward, inputs, lse=-1)
    aten = [(ops, why) for ops, runs_on, why in plan if runs_on == "ATen" and not why.startswith("(only views")]
    assert len([ops for ops, _ in aten if ops == ["linear"]]) == BLOCKS[block][1] // 2, plan
    rest = [ops for ops, _ in aten if ops not in (["linear"], ["sdpfa_fwd"])]
    assert all(ops == ["cat"] for ops in rest) and len(rest) <= BLOCKS[block][2], aten

    forward, inputs = _forward(block, DataType.Float)
    repeat = _grouped_heads_repeat(block, "sdpfa_fwd")
    # (A biased linear's GEMM starts from its bias, copied into the output: part of the GEMM call.)
    copies = _cpu_copies(forward, inputs, lambda shape, outer: repeat(shape, outer) or shape == [B, H, S]
                         or outer[0] == "aten::addmm")
    assert copies == [], copies


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_backward_on_cpu_copies_nothing(block):
    inputs, definition = BLOCKS[block][0]()
    copies = _cpu_copies(definition(DataType.Float), inputs, _grouped_heads_repeat(block, "sdpfa_bwd"))
    assert copies == [], copies


FALLBACK_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import test_lean_backward as t
from meshfuser import DataType
inputs, definition = t.BLOCKS[sys.argv[2]][0]()
saved = t.blocks.GPT_SAVED if sys.argv[2] == "gpt" else t.blocks.LLAMA_SAVED
t._gpu_plan(definition(DataType.BFloat16), inputs, 1 + saved.index("lse"))
"""


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_fallback_dump_lists_only_gemms_attention_and_rope_cat(block):
    """MESHFUSER_DUMP=fallback on the backward's GPU plan: the GEMMs and attention (library kernels,
    by design), RoPE's cat for the Llama block, and no reshape or permute (views are not fallbacks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "fallback"  # read once per process: a fresh one
    run = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT, str(pathlib.Path(__file__).parent), block],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "runs on the ATen evaluator" in line]
    ops = {re.search(r"= (\w+)\(", line).group(1) for line in lines}
    assert lines and ops <= {"matmul", "sdpfa_bwd"} | ({"cat"} if block == "llama" else set()), lines


def test_gpt_forward_without_saving_outputs_the_block_output_alone():
    """save=False (inference): one output, the training forward's first one, checked against PyTorch."""
    e = H * HD
    full = blocks.gpt_parameters(B, S, e, seed=3)
    x = full.pop("x")
    inputs = blocks.gpt_forward_inputs(x, full)
    training = blocks.gpt_forward_definition(B, S, H, HD, 1, "tp").execute(inputs)
    alone = blocks.gpt_forward_definition(B, S, H, HD, 1, "tp", save=False).execute(inputs)
    assert len(alone) == 1 and len(training) == 1 + len(blocks.GPT_SAVED)
    torch.testing.assert_close(alone[0], training[0], rtol=0, atol=0)
    torch.testing.assert_close(alone[0], blocks.gpt_reference({"x": x, **full}, H), rtol=1e-4, atol=1e-4)
