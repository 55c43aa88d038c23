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
