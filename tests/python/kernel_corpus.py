"""A representative corpus of generated kernels, built without a GPU (fd.cuda_kernels on CPU or meta
tensors): pointwise (broadcasts, casts, transcendental ops), inner / outer / middle-axis reductions,
every normalization pattern (softmax, log-softmax, RMSNorm, LayerNorm, forward and backward, inner
and outer), transposes, and kernels that compute in double, in float32, bfloat16 and float16.

`corpus(**kw)` returns (label, source) pairs; `kw` goes to fd.cuda_kernels (arch=..., device_limits=...).
Used by test_codegen_text.py (structure), test_codegen_arch.py (nvcc for every architecture, and the
sm_90 text kept identical) and benchmarks that want the same kernels.

Run as a script to rewrite the sm_90 golden file after an intended change of the generated text:
    PYTHONPATH=python python tests/python/kernel_corpus.py --write-golden
"""
import json
import os
import re
import sys

import torch

from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
import norm_patterns  # noqa: E402

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half}
GOLDEN = os.path.join(os.path.dirname(__file__), "data", "kernel_corpus_sm90.json")


def _meta(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def _pattern(name, dtype, rows, cols, transposed=False, **kw):
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, DTYPES[dtype], rows, cols)
    torch.manual_seed(0)
    return fd.cuda_kernels(norm_patterns.make_inputs(name, dtype, rows, cols, transposed, device="meta"), **kw)


def transposed_3d_neg():
    """A 3-D transpose whose output T1 shares its number with the coordinate of axis 1."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.neg(a))
    return fd, [torch.empty_strided((64, 8, 32), (1, 64, 512))]


def _pointwise(dt, kind):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dt)
        if kind == "gelu_bias":  # gelu(x * y + bias), bias broadcast along the rows
            y = fd.define_tensor([-1, -1], dtype=dt)
            b = fd.define_tensor([1, -1], dtype=dt)
            t = fd.ops.add(fd.ops.mul(fd.ops.cast(x, DataType.Float), fd.ops.cast(y, DataType.Float)),
                           fd.ops.cast(b, DataType.Float))
            fd.add_output(fd.ops.cast(fd.ops.gelu(t), dt))
        elif kind == "broadcast_both":  # x + row vector + column vector
            r = fd.define_tensor([1, -1], dtype=dt)
            c = fd.define_tensor([-1, 1], dtype=dt)
            fd.add_output(fd.ops.add(fd.ops.add(x, r), c))
        elif kind == "casts":  # to every float type, one output each
            f = fd.ops.cast(x, DataType.Float)
            fd.add_output(fd.ops.cast(fd.ops.sigmoid(f), DataType.BFloat16))
            fd.add_output(fd.ops.cast(fd.ops.tanh(f), DataType.Half))
            fd.add_output(fd.ops.silu(f))
        else:
            raise KeyError(kind)
    return fd


def _reduction(dt, dims, op="sum"):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * 3, dtype=dt)
        r = getattr(fd.ops, op)(fd.ops.cast(x, DataType.Float), dims)
        fd.add_output(fd.ops.cast(fd.ops.mul(r, 0.5), dt))
    return fd


def _permute3(dt, order):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=dt)
        y = fd.define_tensor([-1, -1, -1], dtype=dt)
        fd.add_output(fd.ops.mul(fd.ops.permute(x, order), y))
    return fd


def corpus(**kw):
    """(label, source) for every kernel of the corpus; kw goes to fd.cuda_kernels."""
    out = []

    def add(label, sources):
        out.extend((label, src) for src in sources)

    fd, inputs = transposed_3d_neg()
    add("transposed_3d_neg", fd.cuda_kernels(inputs, **kw))
    for label, fd, inputs in norm_patterns.mixed_precision_fusions():
        add(label, fd.cuda_kernels(inputs, **kw))
    for name in norm_patterns.PATTERNS:
        for dtype in (torch.float32, torch.bfloat16):
            for rows, cols in [(4, 1), (8, 7), (16, 1000), (4096, 4096), (2, 65537), (64, 256), (64, 16384)]:
                add(f"{name}_{dtype}_{rows}x{cols}", _pattern(name, dtype, rows, cols, **kw))
        for rows, cols in [(4096, 4096), (64, 2050), (262144, 256)]:
            add(f"{name}_half_{rows}x{cols}", _pattern(name, torch.float16, rows, cols, **kw))
        add(f"{name}_half_transposed", _pattern(name, torch.float16, 16, 1000, transposed=True, **kw))
    for dtype in DTYPES:
        for rows, cols in [(1024, 512), (1000, 777), (33, 4096)]:
            add(f"transposed_add_{dtype}_{rows}x{cols}", _pattern("transposed_add", dtype, rows, cols, **kw))
    for name in norm_patterns.OUTER_PATTERNS:
        for dtype in DTYPES:
            add(f"{name}_{dtype}", _pattern(name, dtype, 1000, 100, **kw))
    for dtype, dt in DTYPES.items():
        for rows, cols in [(16384, 16384), (1000, 777), (4, 64)]:
            m = lambda: _meta((rows, cols), dtype)  # noqa: E731
            row, col = _meta((1, cols), dtype), _meta((rows, 1), dtype)
            add(f"gelu_bias_{dtype}_{rows}x{cols}", _pointwise(dt, "gelu_bias").cuda_kernels([m(), m(), row], **kw))
            add(f"broadcast_{dtype}_{rows}x{cols}", _pointwise(dt, "broadcast_both").cuda_kernels([m(), row, col], **kw))
            add(f"casts_{dtype}_{rows}x{cols}", _pointwise(dt, "casts").cuda_kernels([m()], **kw))
        # inner (many / few rows), outer, middle axes, and a max.
        for shape, dims, op in [((1, 16384, 16384), [2], "sum"), ((1, 8, 1 << 20), [2], "sum"),
                                ((1, 4096, 1000), [2], "max"), ((1, 16384, 16384), [1], "sum"),
                                ((1, 100, 8), [1], "sum"), ((64, 512, 96), [1], "sum"), ((1, 1000, 2048), [1], "min")]:
            add(f"{op}_{dtype}_{'x'.join(map(str, shape))}_dims{dims}",
                _reduction(dt, dims, op).cuda_kernels([_meta(shape, dtype)], **kw))
        for shape, order in [((64, 128, 256), [0, 2, 1]), ((256, 32, 96), [2, 1, 0]), ((7, 130, 66), [1, 0, 2])]:
            out_shape = [shape[i] for i in order]
            fd = _permute3(dt, order)
            add(f"permute_{dtype}_{order}", fd.cuda_kernels([_meta(shape, dtype), _meta(out_shape, dtype)], **kw))
    return out


def kernel_names(sources):
    """label -> the kernel names (each a hash of its source) in generation order."""
    names = {}
    for label, src in sources:
        names.setdefault(label, []).append(re.search(r"\bmf_[a-z]+_[0-9a-f]{16}\b", src).group(0))
    return names


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-golden"]:
        sys.exit(__doc__)
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
        json.dump(kernel_names(corpus(arch="sm_90")), f, indent=0, sort_keys=True)
        f.write("\n")
    print("wrote", GOLDEN)
