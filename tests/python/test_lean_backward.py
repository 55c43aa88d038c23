"""The GPT and Llama-style block backwards (examples/transformer_blocks.py) move no data outside the
GEMMs, attention and generated kernels: the saved q, k, v and attention output keep the projections'
[b, s, heads * head_dim] layout, so splitting and merging heads are views, the attention kernels read
and write that layout in place, and the weight gradients' GEMMs read their operands transposed in
place (a layout flag, not a copy).

Two independent checks: the GPU plan, walked on meta tensors (fd.cuda_kernels, no GPU needed):
every piece on ATen is a GEMM, attention or views; and a CPU run under torch.profiler: no
aten::copy_ at all (the one exception: grouped-query attention repeats the key/value heads for the
kernel, inside the attention op)."""
import pathlib
import re
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


BLOCKS = {"gpt": (_gpt, 12, 0), "llama": (_llama, 14, 2)}  # GEMMs: two per linear; RoPE'd tensors


def _gpu_plan(backward, inputs, lse):
    """(ops, runs_on, why) per piece of the backward's plan for bfloat16 CUDA tensors."""
    meta = [torch.empty_like(t, device="meta", dtype=torch.bfloat16 if t.is_floating_point() and i != lse
                             else t.dtype) for i, t in enumerate(inputs)]  # attention's lse stays float32
    backward.cuda_kernels(meta)
    pieces = [PIECE.search(line.strip()) for line in backward.host_program().splitlines()]
    return [(m.group(1).split(", "), m.group(2), m.group(3)) for m in pieces if m]


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_backward_plan_has_no_copies(block):
    make, linears_gemms, rotated = BLOCKS[block]
    inputs, definition = make()
    saved = blocks.GPT_SAVED if block == "gpt" else blocks.LLAMA_SAVED
    plan = _gpu_plan(definition(DataType.BFloat16), inputs, 1 + saved.index("lse"))
    aten = [(ops, why) for ops, runs_on, why in plan if runs_on == "ATen"]
    gemms = [ops for ops, _ in aten if ops == ["matmul"]]
    attention = [ops for ops, _ in aten if ops == ["sdpfa_bwd"]]
    views = [ops for ops, why in aten if why.startswith("(only views")]
    assert len(gemms) == linears_gemms and len(attention) == 1, plan
    rest = [(ops, why) for ops, why in aten if ops not in (["matmul"], ["sdpfa_bwd"]) and not why.startswith("(only views")]
    # RoPE's rotate_half transpose concatenates the halves: one cat per rotated tensor (q, k) until
    # cat runs inside the generated kernels; nothing else leaves them.
    assert all(ops == ["cat"] for ops, _ in rest) and len(rest) <= rotated, rest
    assert views and all(set(ops) <= {"reshape", "permute", "slice", "broadcast_in_dim"} for ops in views), views
    # The bias and norm-weight gradients are generated reductions.
    assert any(runs_on == "generated" and "sum" in ops for ops, runs_on, _ in plan), plan


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_backward_on_cpu_copies_nothing(block):
    inputs, definition = BLOCKS[block][0]()
    backward = definition(DataType.Float)
    backward.execute(inputs)  # plans and compiles outside the profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        backward.execute(inputs)
    copies = []
    for event in prof.events():
        if event.name != "aten::copy_" or not event.input_shapes or not event.input_shapes[0]:
            continue  # 0-d copies are scalars wrapped for ATen calls
        outer = []
        parent = event.cpu_parent
        while parent is not None:
            outer.append(parent.name)
            parent = parent.cpu_parent
        if block == "llama" and any("sdpfa_bwd" in name for name in outer):
            continue  # the key/value heads repeated for grouped-query attention
        copies.append((event.input_shapes[0], outer[:3]))
    assert copies == [], copies
