"""Which generated kernels the transformer blocks run on a GPU, planned on meta tensors (no GPU
needed): each RoPE is one kernel, SwiGLU's silu and mul are one kernel although the up projection
sits between them in the definition, and the GPT backward computes the GELU backward and its bias
gradient in one reduction kernel. These are the segment order (host/segment_order.cpp) and the
segment planning (runtime/segment_kernels.cpp) as a user's block sees them."""
import os
import re
import sys

import torch

from meshfuser import DataType

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import transformer_blocks as blocks  # noqa: E402

_SEGMENT = re.compile(r"^\s*segment (\d+):$")
_PIECE = re.compile(r"^\s*piece \d+ \[([^\]]*)\]: (.*)$")
B, S, H, HD, KV, FFN = 1, 256, 4, 64, 2, 512


def generated_kernels(fd, inputs):
    """[(segment, ops)] of the generated kernels fd plans for these inputs."""
    fd.cuda_kernels(inputs)
    text = fd.host_program()
    kernels, segment = [], None
    for line in text[text.find("Segmentation"):].splitlines():
        if m := _SEGMENT.match(line):
            segment = int(m.group(1))
        elif (m := _PIECE.match(line)) and m.group(2).startswith("generated"):
            kernels.append((segment, [op.strip() for op in m.group(1).split(",")]))
    return kernels


def meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def llama_backward_meta_inputs():
    """The Llama backward definition's inputs (dy, LLAMA_SAVED, LLAMA_PARAMS) as meta tensors."""
    e, kv = H * HD, KV * HD
    shapes = {"normed0": [B, S, e], "q": [B, S, e], "k": [B, S, kv], "v": [B, S, kv], "attn": [B, S, e],
              "res0": [B, S, e], "normed1": [B, S, e], "gate": [B, S, FFN], "up": [B, S, FFN], "gated": [B, S, FFN]}
    saved = [meta([B, H, S], torch.float32) if n == "lse" else meta([], torch.int64) if n in ("seed", "offset")
             else meta(shapes[n]) for n in blocks.LLAMA_SAVED]
    return [meta([B, S, e])] + saved + [meta(s) for s in blocks.llama_shapes(B, S, e, HD, FFN, kv_heads=KV).values()]


def test_llama_forward_rope_and_swiglu_kernels():
    e = H * HD
    fd = blocks.llama_forward_definition(B, S, H, HD, FFN, 1, "tp", DataType.BFloat16, kv_heads=KV, save=True)
    shapes = blocks.llama_shapes(B, S, e, HD, FFN, kv_heads=KV)
    kernels = generated_kernels(fd, [meta(shapes[n]) for n in blocks.LLAMA_PARAMS])
    rope = [ops for _, ops in kernels if "cat" in ops or "slice" in ops]
    # q and k: x * cos + rotate_half(x) * sin, each all in one kernel.
    assert len(rope) == 2, kernels
    for ops in rope:
        assert sorted(set(ops)) == ["add", "cat", "mul", "neg", "slice"], ops
    swiglu = [ops for _, ops in kernels if "silu" in ops]
    assert swiglu == [["silu", "mul"]], kernels


def test_gpt_backward_gelu_backward_and_bias_gradient_are_one_kernel():
    e = H * HD
    fd = blocks.gpt_backward_definition(B, S, H, HD, 1, "tp", DataType.BFloat16)
    saved = {"lse": meta([B, H, S], torch.float32), "seed": meta([], torch.int64), "offset": meta([], torch.int64),
             "pre": meta([B, S, 4 * e])}
    inputs = [meta([B, S, e])] + [saved.get(n, meta([B, S, e])) for n in blocks.GPT_SAVED]
    inputs += [meta(shape) for shape in blocks.gpt_shapes(B, S, e).values()]
    kernels = generated_kernels(fd, inputs)
    with_erf = [ops for _, ops in kernels if "erf" in ops]
    # The backward of the block's one GELU (the W2 gradient's recomputed GELU is a gelu op).
    assert len(with_erf) == 1, kernels
    assert "sum" in with_erf[0], with_erf
    # It writes d_pre once, its bias gradient and the recomputed GELU: d_pre's [rows, 4e]
    # flattening, which W1's gradient reads, is a view ATen makes after it, not a second store.
    assert "reshape" not in with_erf[0], with_erf
    source = [src for src in fd.cuda_kernels(inputs) if "= erf(T" in src]
    assert len(source) == 1
    params = re.findall(r"\n    (const )?mf_bf16\* __restrict__ T\d+", source[0])
    assert params.count("") == 3, params


def test_norm_backward_statistics_share_the_kernel_of_the_rest_on_one_device():
    """On one device the TP block's Allreduces are NoOps: the backward's recomputed normalization
    statistics (placed before the wait, to overlap an Allreduce) and the rest of the norm backward
    are one normalization kernel; there is no kernel of the statistics alone (it read x once more,
    and LayerNorm's wrote x - mean in float for the next one)."""
    e = H * HD
    fd = blocks.llama_backward_definition(B, S, H, HD, FFN, 1, "tp", DataType.BFloat16, kv_heads=KV)
    llama = generated_kernels(fd, llama_backward_meta_inputs())
    assert "wait 0" in fd.host_program().split("post 0")[1].splitlines()[1], fd.host_program()
    gpt_fd = blocks.gpt_backward_definition(B, S, H, HD, 1, "tp", DataType.BFloat16)
    gpt_saved = {"lse": meta([B, H, S], torch.float32), "seed": meta([], torch.int64),
                 "offset": meta([], torch.int64), "pre": meta([B, S, 4 * e])}
    gpt = generated_kernels(gpt_fd, [meta([B, S, e])] + [gpt_saved.get(n, meta([B, S, e])) for n in blocks.GPT_SAVED]
                            + [meta(shape) for shape in blocks.gpt_shapes(B, S, e).values()])
    for kernels, norms in ((llama, 2), (gpt, 2)):
        with_rsqrt = [ops for _, ops in kernels if "rsqrt" in ops]
        assert len(with_rsqrt) == norms, kernels
        for ops in with_rsqrt:  # the statistics and the input gradient in one kernel
            assert ops.count("sum") >= (2 if kernels is llama else 3) and "sub" in ops, ops


def test_flat_views_are_made_by_aten_not_stored_by_kernels():
    # As an autograd graph writes them: the gate broadcast to [1, s, f] (read by silu here and by
    # work after a GEMM) and silu's result read later beside its squeeze (an output). A kernel that
    # stored those views would copy the gate and write silu's result twice; ATen makes them as
    # views, so the kernel reads the gate in place and stores silu's result once.
    from meshfuser import FusionDefinition

    s, f, k = 64, 32, 16
    with FusionDefinition() as fd:
        gate = fd.define_tensor([s, f], dtype=DataType.BFloat16)
        g = fd.define_tensor([1, s, k], dtype=DataType.BFloat16)
        w = fd.define_tensor([k, f], dtype=DataType.BFloat16)
        gate3 = fd.ops.broadcast_in_dim(gate, [1, s, f], [1, 2])
        act = fd.ops.silu(gate3)
        fd.add_output(fd.ops.squeeze(act, [0]))
        dy = fd.ops.matmul(g, w)
        fd.add_output(fd.ops.mul(fd.ops.mul(dy, gate3), act))
    inputs = [torch.randn(s, f, dtype=torch.bfloat16), torch.randn(1, s, k, dtype=torch.bfloat16),
              torch.randn(k, f, dtype=torch.bfloat16)]
    sources = fd.cuda_kernels(inputs)
    kernels = generated_kernels(fd, inputs)
    # The GEMM reads inputs only and feeds no other GEMM: it runs first (segment order), and all the
    # pointwise work is one kernel that reads the gate in place (the broadcast is indexing) and
    # stores silu's result once, beside the product; the squeeze is ATen's view of it.
    assert [ops for _, ops in kernels] == [["broadcast_in_dim", "silu", "mul", "mul"]], kernels
    stored = [len(re.findall(r"\n\s+mf_bf16\* __restrict__", src)) for src in sources]
    assert stored == [2], stored
    a = torch.nn.functional.silu(inputs[0].float()).bfloat16()
    dy_ref = (inputs[1] @ inputs[2])
    out_sq, out_mul = fd.execute(inputs)
    torch.testing.assert_close(out_sq, a)
    torch.testing.assert_close(out_mul, (dy_ref.float() * inputs[0].float()).bfloat16().float().mul(a.float()).bfloat16())


def test_llama_backward_swiglu_kernel_writes_two_tensors():
    """The forward saves silu(gate) * up (LLAMA_SAVED "gated"), so the backward's SwiGLU kernel
    reads the incoming gradient, gate and up and writes d_gate and d_up only: no silu recomputed for
    w_down's gradient, and d_gate's [rows, ffn] flattening for w_gate's gradient is a view ATen
    makes, not a second store of the same data."""
    fd = blocks.llama_backward_definition(B, S, H, HD, FFN, 1, "tp", DataType.BFloat16, kv_heads=KV)
    inputs = llama_backward_meta_inputs()
    sources = fd.cuda_kernels(inputs)
    kernels = generated_kernels(fd, inputs)
    assert not any("silu" in ops for _, ops in kernels), kernels
    swiglu = [src for src in sources if "= sigmoid(T" in src]
    assert len(swiglu) == 1, kernels
    params = re.findall(r"\n    (const )?mf_bf16\* __restrict__ T\d+", swiglu[0])
    assert params.count("const ") == 3 and params.count("") == 2, params
