"""slice, pad and cat inside generated kernels (codegen/resize.cpp), without a GPU: the kernels a
fusion becomes (fd.cuda_kernels on CPU tensors), and their results, the pointwise kernels run on
the CPU by tests/python/cuda_emulation.py, against PyTorch. RoPE in the rotate_half form is one
kernel with no ATen slice or cat."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
import cuda_emulation  # noqa: E402

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}
needs_gxx = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on this machine")


def scheduler_of(source):
    return re.search(r"void __launch_bounds__\(\d+(?:, \d+)?\) mf_(\w+?)_[0-9a-f]{16}\(", source).group(1)


def rotate_half(fd, t, shape):
    """HF's rotate_half: cat(-t[..., hd/2:], t[..., :hd/2])."""
    *lead, hd = shape
    half = hd // 2
    first = fd.ops.slice(t, [0] * len(shape), [*lead, half])
    second = fd.ops.slice(t, [0] * (len(shape) - 1) + [half], [*lead, hd])
    return fd.ops.cat([fd.ops.neg(second), first], len(shape) - 1)


def rope_definition(b, s, h, hd, dtype):
    """q as the linear's output viewed [b, s, h, hd], heads moved ahead, then t * cos + rotate_half(t) * sin."""
    with FusionDefinition() as fd:
        q = fd.define_tensor([b, s, h, hd], dtype=DTYPES[dtype])
        cos = fd.define_tensor([s, hd], dtype=DTYPES[dtype])
        sin = fd.define_tensor([s, hd], dtype=DTYPES[dtype])
        t = fd.ops.permute(q, [0, 2, 1, 3])
        out = fd.ops.add(fd.ops.mul(t, cos), fd.ops.mul(rotate_half(fd, t, [b, h, s, hd]), sin))
        fd.add_output(fd.ops.cast(out, DTYPES[dtype]))
    return fd


def rope_reference(q, cos, sin):
    t = q.float().permute(0, 2, 1, 3)
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
    return (t * cos.float() + rotated * sin.float()).to(q.dtype)


def rope_inputs(b, s, h, hd, dtype):
    torch.manual_seed(0)
    return [torch.randn(b, s, h, hd, dtype=dtype), torch.randn(s, hd, dtype=dtype), torch.randn(s, hd, dtype=dtype)]


def emulate(fd, inputs, out_shape, out_dtype):
    """The fusion's one pointwise kernel run on the CPU; inputs T0, T1, ... in definition order."""
    (src,) = fd.cuda_kernels(inputs)
    assert scheduler_of(src) == "pointwise", src
    tensors = dict(enumerate(inputs))
    (out_number,) = [n for is_out, n in cuda_emulation.kernel_parameters(src) if is_out]
    tensors[out_number] = torch.empty(out_shape, dtype=out_dtype)
    (out,) = cuda_emulation.run_pointwise(src, tensors)
    return src, out


def test_rope_is_one_vectorized_kernel():
    fd = rope_definition(1, 64, 4, 128, torch.bfloat16)
    sources = fd.cuda_kernels(rope_inputs(1, 64, 4, 128, torch.bfloat16))
    assert [scheduler_of(s) for s in sources] == ["pointwise"]
    (src,) = sources
    # q read with 16-byte vectors as is and in the two shifted contexts of rotate_half, each of the
    # shifted reads guarded to its half; the output one vector store.
    loops = src.count("for (; g")  # the unrolled loops of 4 and 2 groups and the tail
    assert src.count("reinterpret_cast<const mf_array<mf_bf16, 8>*>(T0 +") == 3 * loops, src
    assert re.search(r"\(c\d+ < 64\) \? \*reinterpret_cast", src) and re.search(r"\(64 <= c\d+\) \? \*reinterpret", src)
    assert re.search(r"= \(q\d+ < 64\) \? t\d+_c\d+ : t\d+_c\d+;  // T\d+ = cat", src), src


@needs_gxx
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("b,s,h,hd", [(1, 16, 4, 128), (2, 5, 3, 64), (1, 3, 2, 6)])
def test_rope_matches_pytorch(dtype, b, s, h, hd):
    ins = rope_inputs(b, s, h, hd, dtype)
    src, out = emulate(rope_definition(b, s, h, hd, dtype), ins, (b, h, s, hd), dtype)
    if hd % 16 == 0 and dtype == torch.bfloat16:
        assert f"mf_array<mf_bf16, 8>" in src
    torch.testing.assert_close(out, rope_reference(*ins), rtol=0, atol=0)  # the same float math, rounded once


@needs_gxx
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("extents", [(8, 16), (3, 5, 8), (1, 7, 2)])
def test_cat_of_several_inputs(dtype, axis, extents):
    torch.manual_seed(0)
    shapes = []
    for e in extents:
        shape = [4, 6, 8]
        shape[axis] = e
        shapes.append(shape)
    with FusionDefinition() as fd:
        xs = [fd.define_tensor(shape, dtype=DTYPES[dtype]) for shape in shapes]
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cat([fd.ops.exp(x) for x in xs], axis), 2.0), DTYPES[dtype]))
    ins = [torch.randn(shape, dtype=dtype) for shape in shapes]
    expected = (torch.cat([x.float().exp() for x in ins], axis) * 2.0).to(dtype)
    _, out = emulate(fd, ins, expected.shape, dtype)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)


@needs_gxx
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("widths", [[2, 3], [0, 0, 1, 1], [-2, 3, 1, -1], [8, 8], [-8, 0]])
def test_pad_and_crop(dtype, widths):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 24], dtype=DTYPES[dtype])
        y = fd.define_tensor([6, 24], dtype=DTYPES[dtype])
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.pad(fd.ops.mul(x, y), widths, 1.5), 1.0), DTYPES[dtype]))
    ins = [torch.randn(6, 24, dtype=dtype), torch.randn(6, 24, dtype=dtype)]
    expected = (F.pad(ins[0].float() * ins[1].float(), widths, value=1.5) + 1.0).to(dtype)
    _, out = emulate(fd, ins, expected.shape, dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_gxx
@pytest.mark.parametrize("starts,ends,steps", [([0, 3], [5, 19], [1, 1]), ([1, 0], [6, 24], [2, 3]),
                                               ([0, 8], [6, 24], [1, 8]), ([2, 16], [4, 24], [1, 1])])
def test_slices_with_steps(starts, ends, steps):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 24])
        fd.add_output(fd.ops.relu(fd.ops.slice(x, starts, ends, steps)))
    ins = [torch.randn(6, 24)]
    expected = ins[0][starts[0]:ends[0]:steps[0], starts[1]:ends[1]:steps[1]].relu()
    _, out = emulate(fd, ins, expected.shape, torch.float32)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_gxx
def test_slice_of_a_cat_reads_only_the_inputs_it_needs():
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 8])
        b = fd.define_tensor([4, 8])
        c = fd.ops.cat([a, b], 1)
        fd.add_output(fd.ops.neg(fd.ops.slice(c, [0, 0], [4, 8])))  # all of a, none of b
    ins = [torch.randn(4, 8), torch.randn(4, 8)]
    src, out = emulate(fd, ins, (4, 8), torch.float32)
    assert "T1" not in src.split(") {")[1]  # b is a parameter the kernel never reads
    torch.testing.assert_close(out, -ins[0], rtol=0, atol=0)


def test_resize_in_a_reduction_prologue():
    with FusionDefinition() as fd:
        x = fd.define_tensor([64, 30])
        fd.add_output(fd.ops.sum(fd.ops.pad(fd.ops.exp(x), [1, 1]), [1]))
    (src,) = fd.cuda_kernels([torch.randn(64, 30)])
    assert scheduler_of(src) == "reduction"


def test_a_normalization_with_a_resize_is_two_kernels():
    # RMSNorm over the head dimension, then RoPE: the normalization kernel does not resize yet, so
    # they are two kernels (no ATen segment): a reduction of the statistics, then a pointwise RoPE
    # that computes x * rstd again from x (piece_recompute.h: reading x again costs 4 bytes an
    # element where the normalized x stored in float and read back cost 8).
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 8, 64])
        n = fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(fd.ops.sum(fd.ops.mul(x, x), [2], keepdim=True), 1e-6)))
        fd.add_output(fd.ops.add(n, rotate_half(fd, n, [2, 8, 64])))
    sources = fd.cuda_kernels([torch.randn(2, 8, 64)])
    assert sorted(scheduler_of(s) for s in sources) == ["pointwise", "reduction"]



def test_a_norm_feeding_a_head_norm_is_not_split_for_recompute():
    # RMSNorm over the hidden size, the heads viewed, then a norm over each head and RoPE. Recomputing
    # x * rstd in the next kernel pays only where that kernel does work with it; here the next
    # kernel would be the recompute and the view alone (it writes the normalized rows all the same,
    # reads x twice and adds a launch), so the first normalization stays whole.
    b, s, h, hd = 2, 8, 4, 64
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, s, h * hd])
        n = fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(fd.ops.sum(fd.ops.mul(x, x), [2], keepdim=True), 1e-6)))
        t = fd.ops.permute(fd.ops.reshape(n, [b, s, h, hd]), [0, 2, 1, 3])
        t = fd.ops.mul(t, fd.ops.rsqrt(fd.ops.add(fd.ops.sum(fd.ops.mul(t, t), [3], keepdim=True), 1e-6)))
        fd.add_output(fd.ops.add(t, rotate_half(fd, t, [b, h, s, hd])))
    sources = fd.cuda_kernels([torch.randn(b, s, h * hd)])
    assert [scheduler_of(src) for src in sources] == ["normalization", "normalization", "pointwise"]

REFUSAL_SCRIPT = r"""
import torch
from meshfuser import FusionDefinition
with FusionDefinition() as fd:
    x = fd.define_tensor([6, 24])
    fd.add_output(fd.ops.exp(fd.ops.pad(x, [-5, -18])))   # a crop to one column: a fixed coordinate
print("KERNELS", len(fd.cuda_kernels([torch.randn(6, 24)])))
"""


def test_a_crop_to_one_element_is_refused_with_its_reason():
    # (A slice to one column is an ATen view, moving nothing: not a fallback.)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "fallback"
    r = subprocess.run([sys.executable, "-c", REFUSAL_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if "pad" in l and "runs on the ATen evaluator" in l]
    assert lines and "read at one fixed coordinate" in lines[0], r.stdout
    assert "KERNELS 1" in r.stdout  # the exp is still a generated kernel


def resize_corpus():
    """(label, source): RoPE in both dtypes, a three-way cat, a pad with a crop, a strided slice."""
    out = []
    for dtype in DTYPES:
        fd = rope_definition(1, 64, 4, 128, dtype)
        out.extend((f"rope_{dtype}", s) for s in fd.cuda_kernels(rope_inputs(1, 64, 4, 128, dtype)))
    with FusionDefinition() as fd:
        xs = [fd.define_tensor([4, e], dtype=DataType.BFloat16) for e in (8, 16, 24)]
        y = fd.ops.pad(fd.ops.cat(xs, 1), [-8, 8, 1, 0], 0.5)
        fd.add_output(fd.ops.slice(fd.ops.exp(y), [0, 0], [5, 48], [2, 3]))
    out.extend(("cat_pad_slice", s) for s in fd.cuda_kernels([torch.randn(4, e, dtype=torch.bfloat16)
                                                              for e in (8, 16, 24)]))
    return out


@pytest.mark.timeout(600)
def test_resize_kernels_compile_with_nvcc_for_sm90(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("nvcc is not on this machine: the sm_90 compile of the resize kernels did not run")
    sources = resize_corpus()
    assert len(sources) == 3
    text = "\n".join(f"namespace k{i} {{  // {label}\n{src}\n}}\n" for i, (label, src) in enumerate(sources))
    cu = tmp_path / "resize.cu"
    cu.write_text(text)
    r = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-c", str(cu), "-o", str(tmp_path / "resize.o")],
                       capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-4000:]


@needs_gxx
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_chain_of_cat_pad_and_strided_slice(dtype):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        xs = [fd.define_tensor([4, e], dtype=DTYPES[dtype]) for e in (8, 16, 24)]
        y = fd.ops.pad(fd.ops.cat(xs, 1), [-8, 8, 1, 0], 0.5)
        fd.add_output(fd.ops.cast(fd.ops.slice(fd.ops.exp(y), [0, 0], [5, 48], [2, 3]), DTYPES[dtype]))
    ins = [torch.randn(4, e, dtype=dtype) for e in (8, 16, 24)]
    expected = F.pad(torch.cat([x.float() for x in ins], 1), [-8, 8, 1, 0], value=0.5).exp()[0:5:2, 0:48:3].to(dtype)
    _, out = emulate(fd, ins, expected.shape, dtype)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)


# ---- reshape as a kernel output (the row-major order is kept: stored at the flat index) ----
@needs_gxx
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_merging_the_heads_is_a_generated_copy(dtype):
    # attention's [b, h, s, hd] -> [b, s, h*hd]: ATen's reshape of the permuted view copies; the
    # generated kernel reads the heads in place and writes the merged layout.
    torch.manual_seed(0)
    b, h, s, hd = 2, 3, 5, 16
    with FusionDefinition() as fd:
        attn = fd.define_tensor([b, h, s, hd], dtype=DTYPES[dtype])
        fd.add_output(fd.ops.reshape(fd.ops.permute(attn, [0, 2, 1, 3]), [b, s, h * hd]))
    ins = [torch.randn(b, h, s, hd, dtype=dtype)]
    _, out = emulate(fd, ins, (b, s, h * hd), dtype)
    torch.testing.assert_close(out, ins[0].transpose(1, 2).reshape(b, s, h * hd), rtol=0, atol=0)


@needs_gxx
def test_rope_in_the_projection_layout_with_its_flat_copy():
    # The Llama block's RoPE on [b, s, heads, hd] with [s, 1, hd] tables, also saved flat [b, s, e].
    torch.manual_seed(0)
    b, s, h, hd = 1, 6, 2, 8
    with FusionDefinition() as fd:
        q = fd.define_tensor([b, s, h, hd])
        cos = fd.define_tensor([s, 1, hd])
        sin = fd.define_tensor([s, 1, hd])
        rot = fd.ops.add(fd.ops.mul(q, cos), fd.ops.mul(rotate_half(fd, q, [b, s, h, hd]), sin))
        fd.add_output(rot)
        fd.add_output(fd.ops.reshape(rot, [b, s, h * hd]))
    ins = [torch.randn(b, s, h, hd), torch.randn(s, 1, hd), torch.randn(s, 1, hd)]
    (src,) = fd.cuda_kernels(ins)
    outs = [n for is_out, n in cuda_emulation.kernel_parameters(src) if is_out]
    tensors = dict(enumerate(ins))
    tensors[outs[0]], tensors[outs[1]] = torch.empty(b, s, h, hd), torch.empty(b, s, h * hd)
    rot_out, flat_out = cuda_emulation.run_pointwise(src, tensors)
    half = hd // 2
    expected = ins[0] * ins[1] + torch.cat([-ins[0][..., half:], ins[0][..., :half]], -1) * ins[2]
    torch.testing.assert_close(rot_out, expected, rtol=0, atol=0)
    torch.testing.assert_close(flat_out, expected.reshape(b, s, h * hd), rtol=0, atol=0)


def test_a_reshape_ATen_can_view_stays_a_view():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 6, 32])
        fd.add_output(fd.ops.exp(fd.ops.permute(fd.ops.reshape(x, [2, 6, 4, 8]), [0, 2, 1, 3])))
    # The reshape of the contiguous input is a view (no kernel); the exp reads it in place.
    assert [scheduler_of(s) for s in fd.cuda_kernels([torch.randn(2, 6, 32)])] == ["pointwise"]


BLOCKS_SCRIPT = r"""
import sys, torch
sys.path.insert(0, "examples")
import transformer_blocks as blocks
from meshfuser import FusionDefinition, DataType
b, s, h, hd, ffn = 1, 16, 4, 8, 64
for name in ("gpt", "llama"):
    fd = FusionDefinition()
    with fd:
        if name == "llama":
            blocks.define_llama_forward(fd, b, s, h, hd, ffn, DataType.BFloat16, kv_heads=2)
            full = blocks.llama_parameters(b, s, h * hd, hd, ffn, seed=0, dtype=torch.bfloat16, kv_heads=2)
            ins = blocks.llama_forward_inputs(full.pop("x"), full)
        else:
            blocks.define_gpt_forward(fd, b, s, h, hd, DataType.BFloat16)
            full = blocks.gpt_parameters(b, s, h * hd, seed=0, dtype=torch.bfloat16)
            ins = blocks.gpt_forward_inputs(full.pop("x"), full)
    print("BLOCK", name, "KERNELS", len(fd.cuda_kernels(ins)))
"""


def test_transformer_blocks_leave_only_gemms_and_attention_to_aten():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "fallback"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", BLOCKS_SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                       cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("BLOCK") == 2, r.stdout
    fallbacks = [l for l in r.stdout.splitlines() if "runs on the ATen evaluator" in l]
    others = [l for l in fallbacks if not re.search(r"= (linear|matmul|sdpfa_fwd)\(", l.split(": ", 1)[1])]
    assert not others, "\n".join(others)
