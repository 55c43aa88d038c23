"""Generated kernel text without a GPU: which kernels a fusion becomes (structure checks on the CUDA
source from fd.cuda_kernels on CPU tensors). The nvcc compile of the kernel corpus for every
architecture is in test_codegen_arch.py."""
import os
import re
import subprocess
import sys

import pytest
import torch

from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
import norm_patterns  # noqa: E402
from kernel_corpus import transposed_3d_neg  # noqa: E402

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half}


def build(name, dtype, rows, cols):
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, DTYPES[dtype], rows, cols)
    return fd


def kernels(name, dtype, rows, cols, transposed=False):
    fd = build(name, dtype, rows, cols)  # any pattern of norm_patterns
    torch.manual_seed(0)
    return fd.cuda_kernels(norm_patterns.make_inputs(name, dtype, rows, cols, transposed))


def scheduler_of(source):
    return re.search(r"void __launch_bounds__\(\d+(?:, \d+)?\) mf_(\w+?)_[0-9a-f]{16}\(", source).group(1)


@pytest.mark.parametrize("name", list(norm_patterns.PATTERNS))
@pytest.mark.parametrize("cols", [1, 7, 1000, 4097, 65537])
def test_normalizations_are_one_kernel(name, cols):
    sources = kernels(name, torch.bfloat16, 3, cols)
    assert [scheduler_of(s) for s in sources] == ["normalization"]


@pytest.mark.parametrize("name", list(norm_patterns.OUTER_PATTERNS))
@pytest.mark.parametrize("rows,cols", [(1000, 100), (7, 3), (4096, 1)])
def test_outer_normalizations_are_one_kernel(name, rows, cols):
    (src,) = kernels(name, torch.float32, rows, cols)
    assert scheduler_of(src) == "normalization"
    assert ("// outer normalization" in src) == (cols > 1)  # one column: a single row, reduced innermost


def test_softmax_reads_the_row_once_in_registers():
    (src,) = kernels("softmax", torch.bfloat16, 32768, 4096)
    assert "persistent" in src and "multi-pass" not in src
    # x is read with one 16-byte access per group, in the first loop only; out written once.
    assert src.count("reinterpret_cast<const mf_array<mf_bf16, 8>*>(T0 +") == 1
    # The output: eight bf16 as four pairs converted by one cvt each, one 16-byte store.
    assert src.count("reinterpret_cast<mf_array<unsigned int, 4>*>(T") == 1 and "mf_pack_bf16x2(" in src
    assert "// loop 2 over the row" in src and "// loop 3" not in src  # max, sum of exp, output
    # exp(x - max) is computed once (kept as floats for the output loop); the sum is inverted once per row.
    assert src.count("= __expf(") == 1 and "mf_e5[" in src
    assert "1.0f / t7" in src and "t5 * mf_rcp7" in src
    assert "__shfl_xor_sync" in src and "mf_red" in src


def test_exp_of_a_shift_by_the_row_max_takes_the_hardware_exp():
    # x - max(x) is <= 0, where __expf is as accurate as expf (ir/value_bounds.h): softmax,
    # log-softmax and the outer softmax use it; an exp whose operand is not known to be <= 0 does not.
    for name, shape in [("softmax", (64, 1000)), ("log_softmax", (64, 1000)), ("softmax_dim0", (1000, 64))]:
        with FusionDefinition() as fd:
            getattr(norm_patterns, name)(fd, DataType.BFloat16, *shape)
        (src,) = fd.cuda_kernels(norm_patterns.make_inputs(name, torch.bfloat16, *shape, device="meta"))
        assert re.search(r"= __expf\(t\d+\);", src) and not re.search(r"[^_]expf\(t\d+\)", src), (name, src)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(fd.ops.sub(x, fd.ops.max(y, [1], keepdim=True))))  # another tensor's max
        fd.add_output(fd.ops.exp(fd.ops.sub(fd.ops.max(x, [1], keepdim=True), x)))  # >= 0
        fd.add_output(fd.ops.exp(x))
    srcs = "".join(fd.cuda_kernels([torch.empty(8, 64, device="meta")] * 2))
    assert "__expf" not in srcs and len(re.findall(r"expf\(t\d+\)", srcs)) == 3, srcs


def test_only_softmax_like_block_rows_stage_the_next_row():
    # Rows that keep exp values stage the block's next row in shared memory; 64 KiB of float row
    # takes dynamic shared memory (past the 48 KiB static limit).
    (src,) = kernels("softmax", torch.float32, 64, 16384)
    assert "mf_array<float, 4> (*const mf_s0)[512] = reinterpret_cast<mf_array<float, 4> (*)[512]>(mf_dyn + 0);" in src
    assert src.count("mf_cp_async<16>(&mf_s0[it][threadIdx.x], T0 +") == 2
    # RMSNorm (no cached values) reads x from global memory; its weight is not staged either.
    (src,) = kernels("rms_norm", torch.bfloat16, 8192, 16384)
    assert "mf_cp_async" not in src and "mf_dyn" not in src
    # Softmax rows of fewer than 512 threads take a block per row instead (more blocks per SM).
    (src,) = kernels("softmax", torch.bfloat16, 32768, 4096)
    assert "128 x 1 threads per block" in src and "mf_cp_async" not in src and "mf_dyn" not in src
    # Two bf16 per vector (4 bytes, the smallest cp.async) are staged; one (2 bytes) is not.
    (src,) = kernels("softmax", torch.bfloat16, 64, 2 * 1025)
    assert "512 x 1 threads per block" in src and "mf_cp_async<4>(" in src
    (src,) = kernels("softmax", torch.bfloat16, 64, 4097)
    assert "mf_cp_async" not in src


def test_short_rows_take_a_warp_each():
    # 32 vectors of 8: half a warp per row, two vectors per lane, shuffles within the half.
    (src,) = kernels("rms_norm", torch.bfloat16, 262144, 256)
    assert "16 x 16 threads per block" in src and "mf_red" not in src
    assert "for (int o = 8; o > 0; o >>= 1)" in src
    # An odd row count would leave half a warp in the row loop alone: whole warps per row then.
    (src,) = kernels("rms_norm", torch.bfloat16, 7, 256)
    assert "32 x 8 threads per block" in src


def test_long_rows_are_multi_pass_in_one_kernel():
    (src,) = kernels("layer_norm", torch.float32, 2, (1 << 20) + 3)
    assert "multi-pass" in src
    assert src.count("// loop ") == 3


def test_layer_norm_writes_mean_and_rstd_once_per_row():
    (src,) = kernels("layer_norm", torch.bfloat16, 64, 1024)
    assert len(re.findall(r"if \(threadIdx\.x == 0\) T\d+\[row\]", src)) == 2


def test_transposed_input_normalization_is_correct_scalar_code():
    (src,) = kernels("softmax", torch.bfloat16, 64, 1000, transposed=True)
    assert "1 per vector" in src


def test_normalization_matches_aten_on_cpu_shapes():
    # The plan must not change what runs on CPUs: the ATen evaluator computes the same formula as
    # PyTorch (a guard for the pattern builders the GPU tests and the benchmark share).
    for name in [*norm_patterns.PATTERNS, *norm_patterns.OUTER_PATTERNS]:
        torch.manual_seed(0)
        inputs = norm_patterns.make_inputs(name, torch.float32, 5, 33)
        out = build(name, torch.float32, 5, 33).execute(inputs)
        ref = norm_patterns.torch_reference(name, inputs, torch.float32)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def test_double_compute_keeps_float_vectors_float():
    # A float tensor's vectors are read and written as mf_array<float, N> in a double-compute kernel
    # (as mf_array<double, N>, each double took the bytes of two floats: silently wrong values).
    for label, fd, inputs in norm_patterns.mixed_precision_fusions():
        (src,) = fd.cuda_kernels(inputs)
        assert "double" in src, label
        if label == "double_plus_1e18":  # a double literal, not 1e+18f (float(1e18))
            assert "t0 + 1e+18;" in src, src
            continue
        if label == "transposed_float_double":  # the float tiles of the transpose kernel hold floats only
            assert scheduler_of(src) == "pointwise" and "mf_tile" not in src
            continue
        assert re.search(r"reinterpret_cast<const mf_array<float, \d+>\*>\(T0 \+", src) or \
            re.search(r"mf_cp_async<16>\(&mf_s0", src) and "mf_array<float, 4> (*const mf_s0)" in src, label
        assert not re.search(r"mf_array<double, \d+>\*>\(T0 \+", src), label
        if label != "softmax_float_int32":
            assert re.search(r"reinterpret_cast<mf_array<float, \d+>\*>\(T\d+ \+", src), label  # the float output


def test_int32_results_wrap_at_every_op():
    # Integers are computed in double: each int32 result wraps where PyTorch's does (not only at the
    # store), and a product is formed in 64-bit integers (a double loses bits past 2^53).
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int32)
        y = fd.define_tensor([-1], dtype=DataType.Int32)
        s = fd.ops.add(x, y)
        fd.add_output(fd.ops.gt(s, 0))
        fd.add_output(fd.ops.mul(x, y))
    a = torch.tensor([2 ** 31 - 1, 46341, -5] * 32, dtype=torch.int32)
    b = torch.tensor([1, 46341, 7] * 32, dtype=torch.int32)
    (src,) = fd.cuda_kernels([a, b])
    assert re.search(r"const double t\d+ = \(double\)\(int\)\(long long\)\(t0 \+ t1\);", src), src
    assert "(double)(int)((long long)((unsigned long long)(long long)(t0) * (unsigned long long)(long long)(t1)))" in src
    # The ATen path agrees with PyTorch (the GPU test runs the kernel against it).
    gt, prod = fd.execute([a, b])
    assert torch.equal(gt, (a + b) > 0) and torch.equal(prod, a * b)


def test_integer_semantics_in_kernel_text():
    # A combined int32 sum wraps before the ops after it read it (PyTorch's int32 sum wraps).
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        fd.add_output(fd.ops.gt(fd.ops.sum(t, [1], dtype=DataType.Int32), 0))
    x = torch.full((4, 64), 2 ** 30, dtype=torch.int32)
    (src,) = fd.cuda_kernels([x])
    assert re.search(r"(t\d+) = \(double\)\(int\)\(long long\)\(\1\);", src), src
    assert torch.equal(fd.execute([x])[0], torch.sum(x, 1, dtype=torch.int32) > 0)
    # An int64 scalar meeting an int32 tensor is converted to int32 first (wrapping), as PyTorch does.
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.maximum(t, 2 ** 32))
        fd.add_output(fd.ops.eq(t, 2 ** 32))
    y = torch.tensor([5, 0] * 32, dtype=torch.int32)
    (src,) = fd.cuda_kernels([y])
    assert "mf_max(t0, (double)(int)(long long)(4294967296.0))" in src
    assert "(t0 == (double)(int)(long long)(4294967296.0) ? 1.0 : 0.0)" in src
    # Integer powers and int64 products stay on ATen (double compute would round them); the int32
    # add beside them is still generated.
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.Int32)
        u = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.pow(t, u))
        c = fd.ops.cast(t, DataType.Int)
        fd.add_output(fd.ops.mul(c, c))
        fd.add_output(fd.ops.add(t, u))
    sources = fd.cuda_kernels([y, y])
    assert not any("pow(" in k or "powf(" in k or "unsigned long long" in k for k in sources)
    assert any("t0 + t1" in k for k in sources)


def test_review_fixes_in_kernel_text():
    # sum(x, dtype=int32) converts each element before summing (PyTorch), not the float sum at the end.
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(a, [1], dtype=DataType.Int32))
    x = torch.full((4, 64), 0.9)
    (src,) = fd.cuda_kernels([x])
    assert re.search(r"const double (t\d+) = \(double\)\(int\)\(long long\)\(t0\);.*\n.*= t\d+ \+ \1;", src), src
    assert re.search(r"T\d+\[row\] = \(int\)\(long long\)\(t\d+\);", src)  # an int32 result wraps past 2^31 (PyTorch), no saturation
    assert torch.equal(fd.execute([x])[0], torch.sum(x, 1, dtype=torch.int32))
    # A float constant past float's range is float infinity, not the text "inf.0f".
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(a, 1e39))
    (src,) = fd.cuda_kernels([torch.randn(64)])
    assert "t0 * __int_as_float(0x7f800000)" in src and "inf." not in src
    # In a kernel computing in double (an int32 tensor is in it), float values are still floats:
    # a float product equals its float32 result, exp(100) overflows.
    with FusionDefinition() as fd:
        a, b, c = (fd.define_tensor([-1]) for _ in range(3))
        idx = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.eq(fd.ops.mul(a, b), c))
        fd.add_output(fd.ops.add(idx, 1))
        fd.add_output(fd.ops.mul(fd.ops.exp(a), 0.0))
    (src,) = fd.cuda_kernels([torch.randn(64), torch.randn(64), torch.randn(64), torch.zeros(64, dtype=torch.int32)])
    assert "mf_round_to_float(t0 * t1)" in src and "mf_round_to_float(exp(t0))" in src, src
    # The transpose kernel's coordinates do not shadow output vectors (o1 was both).
    fd, inputs = transposed_3d_neg()
    (src,) = fd.cuda_kernels(inputs)
    assert scheduler_of(src) == "transpose" and "const int o1 " not in src and "mf_o1" in src


def test_transposed_operand_goes_through_a_shared_memory_tile():
    (src,) = kernels("transposed_add", torch.bfloat16, 1000, 777)
    assert scheduler_of(src) == "transpose"
    # B = 777 is odd: scalar accesses along B, a 16 x 64 tile; A = 1000 is even: pairs along A.
    assert src.count("__shared__ float mf_tile") == 1 and "[16][64]" in src
    assert "make_float2(" in src and "al ^ sw" in src


def test_same_stride_order_stays_pointwise():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        y = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.add(x, y))
    (src,) = fd.cuda_kernels([torch.randn(64, 64).bfloat16(), torch.randn(64, 64).bfloat16()])
    assert scheduler_of(src) == "pointwise"


def test_reductions_over_different_axes_split_into_two_kernels():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.max(x, [0]))
    sources = fd.cuda_kernels([torch.randn(64, 128)])
    assert [scheduler_of(s) for s in sources] == ["reduction", "reduction"]


def test_layer_norm_with_weight_gradients_is_generated_kernels_only():
    # dx (a normalization over rows) and dw = sum(g * xhat, 0) (a reduction over the other axis).
    with FusionDefinition() as fd:
        g = fd.define_tensor([-1, -1])
        x = fd.define_tensor([-1, -1])
        rstd = fd.ops.broadcast_in_dim(fd.define_tensor([-1]), [-1, 256], [0])
        xhat = fd.ops.mul(x, rstd)
        c = fd.ops.broadcast_in_dim(fd.ops.sum(fd.ops.mul(g, xhat), [1]), [-1, 256], [0])
        fd.add_output(fd.ops.mul(rstd, fd.ops.sub(g, fd.ops.mul(xhat, c))))
        fd.add_output(fd.ops.sum(fd.ops.mul(g, xhat), [0]))
    sources = fd.cuda_kernels([torch.randn(64, 256), torch.randn(64, 256), torch.rand(64)])
    assert sorted(scheduler_of(s) for s in sources) == ["normalization", "reduction"]


FALLBACK_SCRIPT = r"""
import torch
from meshfuser import FusionDefinition
with FusionDefinition() as fd:
    x = fd.define_tensor([-1, -1])
    w = fd.define_tensor([-1, -1])
    y = fd.ops.relu(fd.ops.matmul(x, w))
    m = fd.ops.max(y, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(y, m))
    fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
print("KERNELS", len(fd.cuda_kernels([torch.randn(8, 16), torch.randn(16, 32)])))
"""


def test_fallback_dump_names_each_op_left_on_aten():
    # A fresh process (dump options are read once), with its own single-rank process group.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "fallback"
    r = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if "runs on the ATen evaluator" in l]
    assert len(lines) == 1 and "matmul" in lines[0] and "cuBLAS" in lines[0], r.stdout
    assert "KERNELS 1" in r.stdout  # relu and the softmax: one generated kernel


def test_integer_reductions_are_generated_in_double():
    # int32 in, int64 sum out (PyTorch's accumulation type): a kernel computing in double.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        fd.add_output(fd.ops.sum(x, [1]))
    (src,) = fd.cuda_kernels([torch.zeros(8, 16, dtype=torch.int32)])
    assert scheduler_of(src) == "reduction"
    assert "const int* __restrict__ T0" in src and "long long* __restrict__ T1" in src
    assert "double t1 = 0.0;" in src and "expf(t" not in src


def test_int64_inputs_stay_on_aten(monkeypatch, capfd):
    # Double compute rounds int64 values past 2^53 (2^53 + 1 + 0 gave 2^53): no kernel reads one.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.add(x, 0))
        fd.add_output(fd.ops.sum(x, [1]))
    x = torch.full((8, 16), 2 ** 53 + 1, dtype=torch.int64)
    assert fd.cuda_kernels([x]) == []
    out, total = fd.execute([x])
    assert torch.equal(out, x) and torch.equal(total, x.sum(1))


def test_double_compute_keeps_float_outputs_float():
    """Integer inputs make a kernel compute in double; a float output (true division of integers)
    is still stored through a float pointer (a double store wrote past the float buffer: NaNs on
    the H200)."""
    a = torch.randint(-1000, 1000, (129, 65), dtype=torch.int32)
    b = torch.randint(-1000, 1000, (65,), dtype=torch.int32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        y = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.div(x, y))
    (source,) = fd.cuda_kernels([a, b])
    out = fd.execute([a, b])[0]
    assert out.dtype == torch.float32
    params = re.search(r"mf_pointwise_[0-9a-f]{16}\(([^)]*)\)", source).group(1)
    assert "const int*" in params, params
    assert re.search(r"\bfloat\* __restrict__ T\d+", params), params
    assert "double*" not in params, params
