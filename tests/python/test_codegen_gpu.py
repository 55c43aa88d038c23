"""Generated CUDA kernels against the ATen evaluator (the same definition run on CPU tensors):
every op x dtype, odd and aligned shapes, broadcast patterns, reductions, and random fusions.
Needs a CUDA GPU; on machines without one these tests are skipped (missing resource)."""
import pytest
import torch
from hypothesis import assume, HealthCheck, given, settings, strategies as st

import meshfuser
from meshfuser import DataType, FusionDefinition

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = {torch.float32: DataType.Float, torch.float16: DataType.Half, torch.bfloat16: DataType.BFloat16}
UNARY = ["neg", "abs", "exp", "tanh", "relu", "gelu", "sigmoid", "silu", "erf", "sin", "cos"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def run_both(fd, inputs, expect_scheduler):
    reference = fd.execute([t.cpu() if isinstance(t, torch.Tensor) else t for t in inputs])
    with meshfuser.Profiler() as prof:
        result = fd.execute([t.cuda() if isinstance(t, torch.Tensor) else t for t in inputs])
    schedulers = [k.scheduler for k in prof.profile.kernel_profiles]
    assert expect_scheduler in schedulers, schedulers
    for r, e in zip(result, reference):
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(e.dtype, 0)
        torch.testing.assert_close(r.cpu(), e, rtol=max(tol, 1.3e-6), atol=max(tol, 1e-5), equal_nan=True)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("shape", [(1000, 7), (64, 256), (3, 5, 129)])
def test_unary(op, dtype, shape):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * len(shape), dtype=DTYPES[dtype])
        fd.add_output(fd.ops.cast(getattr(fd.ops, op)(x), DTYPES[dtype]))
    run_both(fd, [torch.randn(shape, dtype=dtype)], "pointwise")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("shapes", [((128, 64), (128, 64)), ((129, 33), (33,)), ((8, 1, 16), (1, 5, 16)), ((4096,), (4096,))])
def test_binary_broadcast(op, dtype, shapes):
    torch.manual_seed(0)
    a_shape, b_shape = shapes
    with FusionDefinition() as fd:
        a = fd.define_tensor([s if s == 1 else -1 for s in a_shape], dtype=DTYPES[dtype])
        b = fd.define_tensor([s if s == 1 else -1 for s in b_shape], dtype=DTYPES[dtype])
        fd.add_output(getattr(fd.ops, op)(a, b))
    run_both(fd, [torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)], "pointwise")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape", [(1024, 1024), (37, 1000), (5000, 13)])
def test_reductions_with_prologue(dtype, axis, shape):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DTYPES[dtype])
        y = fd.ops.relu(fd.ops.mul(x, 2.0))
        fd.add_output(fd.ops.sum(y, [axis], dtype=DataType.Float))
    run_both(fd, [torch.randn(shape, dtype=dtype)], "reduction")


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min(op):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(getattr(fd.ops, op)(x, [1]))
    run_both(fd, [torch.randn(300, 517)], "reduction")


OPS = st.sampled_from(UNARY + BINARY)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(OPS, min_size=1, max_size=6), rows=st.integers(1, 300), cols=st.integers(1, 300),
       dtype=st.sampled_from(list(DTYPES)), bias=st.booleans())
def test_random_pointwise_fusions(ops, rows, cols, dtype, bias):
    # Generated kernels compute in float and round once at the end, so the reference is the same
    # fusion evaluated by ATen in float32 on the same (upcast) inputs, rounded to dtype at the end.
    def build(dt):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=dt)
            y = fd.define_tensor([-1], dtype=dt) if bias else fd.define_tensor([-1, -1], dtype=dt)
            t = x
            for op in ops:
                t = getattr(fd.ops, op)(t, y) if op in BINARY else getattr(fd.ops, op)(t)
            fd.add_output(fd.ops.cast(t, dt))
        return fd

    torch.manual_seed(0)
    inputs = [torch.randn(rows, cols, dtype=dtype) * 0.5, torch.randn((cols,) if bias else (rows, cols), dtype=dtype) * 0.5]
    reference = build(DataType.Float).execute([t.float() for t in inputs])[0].to(dtype)
    # Chains of exp overflow; past float's range CUDA's and the CPU's expf may round differently to
    # inf, and inf then meets ops whose value there differs (seen: gelu). Finite results are compared.
    assume(bool(torch.isfinite(reference).all()))
    with meshfuser.Profiler() as prof:
        result = build(DTYPES[dtype]).execute([t.cuda() for t in inputs])[0].cpu()
    assert "pointwise" in [k.scheduler for k in prof.profile.kernel_profiles]
    # float32: CUDA's expf/tanhf/erff are within 2 ulp of the CPU's, and chains of exp amplify a
    # relative error by the magnitude of their argument (exp(exp(x)) at 80 turns 1e-7 into 1e-5).
    tol = {torch.float32: 2e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(result, reference, rtol=tol, atol=tol, equal_nan=True)


# ---- normalizations (one generated kernel per fusion) ----
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import norm_patterns  # noqa: E402

ALL_DTYPES = {**DTYPES}
WIDTHS = [1, 7, 1000, 4097, 65537, (1 << 20) + 3]


def rows_for(cols):
    return max(2, min(1000, (1 << 21) // cols))


def assert_matches(result, reference):
    for r, e in zip(result, reference):
        tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[e.dtype]
        torch.testing.assert_close(r.cpu(), e, rtol=tol, atol=1e-5 if e.dtype == torch.float32 else tol,
                                   equal_nan=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("cols", WIDTHS)
@pytest.mark.parametrize("dtype", list(ALL_DTYPES))
@pytest.mark.parametrize("name", list(norm_patterns.PATTERNS))
def test_normalization_kernels(name, dtype, cols, transposed):
    rows = rows_for(cols)
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, ALL_DTYPES[dtype], rows, cols)
    torch.manual_seed(0)
    inputs = norm_patterns.make_inputs(name, dtype, rows, cols, transposed)
    reference = fd.execute(inputs)
    with meshfuser.Profiler() as prof:
        result = fd.execute([t.cuda() for t in inputs])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["normalization"]
    assert_matches(result, reference)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cols", [256, 4096, 16384, 65537])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_float32_softmax_with_the_hardware_exp_holds_default_tolerances(name, cols):
    # exp(x - max(x)) runs as __expf (its operand is <= 0). Against float64 PyTorch, the float32
    # results must still hold torch.testing's float32 tolerances, also for logits spread widely
    # (exp arguments down to about -100) and rows with -inf entries.
    rows = 64
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, DataType.Float, rows, cols)
    torch.manual_seed(0)
    x = torch.randn(rows, cols) * 12
    x[1] += 1e4
    x[2, ::3] = float("-inf")
    (result,) = fd.execute([x.cuda()])
    reference = getattr(torch, name)(x.double(), -1).float()
    torch.testing.assert_close(result.cpu(), reference)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm_backward", "layer_norm_backward"])
@pytest.mark.parametrize("rows,cols", [(40000, 1000), (3001, 16384)])
def test_more_rows_than_resident_blocks(name, dtype, rows, cols):
    # Rows are handed to blocks as SM slots free up; 512-thread softmax rows (16384 columns) instead
    # have each block of one wave walk many rows, staging the next in shared memory meanwhile.
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, ALL_DTYPES[dtype], rows, cols)
    torch.manual_seed(0)
    inputs = norm_patterns.make_inputs(name, dtype, rows, cols)
    reference = fd.execute(inputs)
    (src,) = fd.cuda_kernels(inputs)
    assert ("mf_cp_async" in src) == (name == "softmax" and cols == 16384)  # only wide rows keeping exp values
    assert_matches(fd.execute([t.cuda() for t in inputs]), reference)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("rows,cols", [(1, 7), (7, 1000), (1000, 7), (4097, 64), (65537, 3), (300, 4097)])
@pytest.mark.parametrize("dtype", list(ALL_DTYPES))
@pytest.mark.parametrize("name", list(norm_patterns.OUTER_PATTERNS))
def test_outer_normalization_kernels(name, dtype, rows, cols, transposed):
    """Statistics over the outer axis (batch-norm-like), one kernel."""
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, ALL_DTYPES[dtype], rows, cols)
    torch.manual_seed(0)
    inputs = norm_patterns.make_inputs(name, dtype, rows, cols, transposed)
    reference = fd.execute(inputs)
    with meshfuser.Profiler() as prof:
        result = fd.execute([t.cuda() for t in inputs])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["normalization"]
    assert_matches(result, reference)


@pytest.mark.parametrize("dtype", list(ALL_DTYPES))
@pytest.mark.parametrize("rows,cols", [(1000, 777), (256, 512), (33, 4096), (4097, 3)])
def test_transposed_add_kernel(dtype, rows, cols):
    with FusionDefinition() as fd:
        norm_patterns.transposed_add(fd, ALL_DTYPES[dtype], rows, cols)
    torch.manual_seed(0)
    inputs = norm_patterns.make_inputs("transposed_add", dtype, rows, cols)
    reference = fd.execute(inputs)
    with meshfuser.Profiler() as prof:
        result = fd.execute([t.cuda() for t in inputs])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["transpose"]
    assert_matches(result, reference)


def test_batched_transpose_with_broadcast_bias():
    """[b, n, m] permuted to [b, m, n], plus a [n] bias and a contiguous [b, m, n] operand."""
    torch.manual_seed(0)
    x, y, bias = torch.randn(3, 100, 64), torch.randn(3, 64, 100), torch.randn(100)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1, -1])
        ty = fd.define_tensor([-1, -1, -1])
        tb = fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(fd.ops.add(fd.ops.permute(tx, [0, 2, 1]), ty), tb))
    reference = fd.execute([x, y, bias])
    with meshfuser.Profiler() as prof:
        result = fd.execute([x.cuda(), y.cuda(), bias.cuda()])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["transpose"]
    assert_matches(result, reference)


@pytest.mark.parametrize("index", range(len(norm_patterns.mixed_precision_fusions())))
def test_float_tensors_beside_double_or_integer_ones(index):
    """Double compute with float tensors' vectors kept float (pointwise, normalization, staged rows)."""
    label, fd, inputs = norm_patterns.mixed_precision_fusions()[index]
    reference = fd.execute(inputs)
    result = fd.execute([t.cuda() for t in inputs])
    for r, e in zip(result, reference):
        assert r.dtype == e.dtype, label
        torch.testing.assert_close(r.cpu(), e, rtol=1e-5, atol=1e-6, msg=label)


PRE = ["neg", "abs", "exp", "tanh", "relu", "sigmoid", "silu", "sin"]
COMBINE = ["add", "sub", "mul", "div", "maximum", "minimum"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pre=st.lists(st.sampled_from(PRE), max_size=3), reduce_op=st.sampled_from(["sum", "max", "min"]),
       combine=st.sampled_from(COMBINE), post=st.lists(st.sampled_from(PRE), max_size=2),
       second=st.booleans(), rows=st.integers(1, 64), cols=st.sampled_from([1, 3, 64, 100, 256, 1000, 2048, 5000]),
       dtype=st.sampled_from(list(DTYPES)), weight=st.booleans(), keep_stat=st.booleans())
def test_random_normalization_fusions(pre, reduce_op, combine, post, second, rows, cols, dtype, weight, keep_stat):
    """A random prologue, a reduction broadcast back and combined with the row, an optional second
    reduction of the result (broadcast back again), a random epilogue; optionally a weight along
    the row and the first statistic as a second output. One normalization kernel, ATen's numbers."""
    def build(dt, compute=DataType.Float):
        with FusionDefinition() as fd:
            x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=dt), compute)
            w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), compute) if weight else None
            t = x
            for op in pre:
                t = getattr(fd.ops, op)(t)
            stat = getattr(fd.ops, reduce_op)(t, [1])
            b = fd.ops.broadcast_in_dim(stat, [-1, cols], [0])
            if combine == "div":  # keep the denominator away from 0 (a sum of either sign)
                b = fd.ops.add(fd.ops.abs(b), 1.0)
            y = getattr(fd.ops, combine)(t, b)
            if w is not None:
                y = fd.ops.mul(y, w)
            if second:
                s2 = fd.ops.sum(fd.ops.mul(y, y), [1])
                y = fd.ops.mul(y, fd.ops.broadcast_in_dim(fd.ops.rsqrt(fd.ops.add(s2, 1.0)), [-1, cols], [0]))
            for op in post:
                y = getattr(fd.ops, op)(y)
            fd.add_output(fd.ops.cast(y, dt))
            if keep_stat:
                fd.add_output(stat)
        return fd

    torch.manual_seed(0)
    inputs = [torch.randn(rows, cols).to(dtype)] + ([(torch.rand(cols) + 0.5).to(dtype)] if weight else [])
    reference = build(DataType.Float).execute([t.float() for t in inputs])
    assume(all(bool(torch.isfinite(r).all()) for r in reference))
    # Ill-conditioned draws (sin of exp(exp(x)) ~ 1e5 turns the last bit of expf into 0.02) are
    # skipped: when float32 on the CPU already misses the float64 result by more than the
    # tolerance, no float32 kernel can be held to it.
    exact = build(DataType.Double, DataType.Double).execute([t.double() for t in inputs])
    tol32 = 2e-4
    assume(all(bool(torch.allclose(r.double(), e, rtol=tol32, atol=tol32 * max(1.0, float(e.abs().max()) if e.numel() else 1.0),
                                    equal_nan=True)) for r, e in zip(reference, exact)))
    with meshfuser.Profiler() as prof:
        result = build(DTYPES[dtype]).execute([t.cuda() for t in inputs])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["normalization"]
    tol = {torch.float32: 2e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    # A division by a statistic near zero amplifies the last bit of the sum: compare relative to
    # the output's scale.
    for r, e in zip(result, reference):
        e = e.to(r.dtype)
        scale = float(e.float().abs().max()) if e.numel() else 1.0
        torch.testing.assert_close(r.cpu(), e, rtol=tol, atol=tol * max(1.0, scale), equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,dims", [((6, 1000, 40), [1]), ((3, 7, 5, 64), [1, 2]), ((128, 33, 8), [1]),
                                        ((2, 3, 4), [0, 1]), ((5, 300, 7), [2]), ((64, 9, 129), [0])])
def test_reductions_over_any_adjacent_axes(op, dtype, shape, dims):
    """Middle axes, several axes, with a comparison and `where` in the prologue."""
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor([-1] * len(shape), dtype=DTYPES[dtype]), DataType.Float)
        leaky = fd.ops.where(fd.ops.gt(x, 0.0), x, fd.ops.mul(x, 0.1))
        fd.add_output(getattr(fd.ops, op)(leaky, dims))
    inputs = [torch.randn(shape).to(dtype)]
    reference = fd.execute(inputs)
    with meshfuser.Profiler() as prof:
        result = fd.execute([t.cuda() for t in inputs])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["reduction"]
    torch.testing.assert_close(result[0].cpu(), reference[0], rtol=1e-4, atol=1e-4)


INT_DTYPES = {torch.float64: DataType.Double, torch.int64: DataType.Int, torch.int32: DataType.Int32,
              torch.bool: DataType.Bool}


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", list(INT_DTYPES))
@pytest.mark.parametrize("shape,dims", [((300, 517), [1]), ((517, 300), [0]), ((6, 100, 40), [1])])
def test_reductions_of_double_integer_and_bool(op, dtype, shape, dims):
    """Kernels with double or integer tensors compute in double: exact for these integers."""
    torch.manual_seed(0)
    x = (torch.randn(shape) * 100).to(dtype) if dtype != torch.bool else torch.randn(shape) > 0
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(shape), dtype=INT_DTYPES[dtype])
        fd.add_output(getattr(fd.ops, op)(t, dims))
    reference = fd.execute([x])
    with meshfuser.Profiler() as prof:
        result = fd.execute([x.cuda()])
    # int64 inputs stay on ATen (double compute is exact below 2^53 only).
    expected = ["expr_eval"] if dtype == torch.int64 else ["reduction"]
    assert [k.scheduler for k in prof.profile.kernel_profiles] == expected
    assert result[0].dtype == reference[0].dtype
    torch.testing.assert_close(result[0].cpu(), reference[0], rtol=1e-12, atol=0)


def test_int32_arithmetic_wraps_like_pytorch():
    """Kernels compute int32 in double; results past 2^31 wrap at the store, as ATen's do."""
    a = torch.tensor([2 ** 31 - 1, -2 ** 31, 5, -7] * 16, dtype=torch.int32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.add(t, 1))
        fd.add_output(fd.ops.mul(fd.ops.sub(t, 1), 3))
    reference = fd.execute([a])
    with meshfuser.Profiler() as prof:
        result = fd.execute([a.cuda()])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["pointwise"]
    for r, e in zip(result, reference):
        assert torch.equal(r.cpu(), e)


def test_int32_overflow_wraps_before_later_ops():
    """(x + y) > 0 and x * y where the sum or product passes 2^31 (and the product 2^53): the kernel
    sees the wrapped int32 values, as PyTorch does."""
    torch.manual_seed(0)
    a = torch.randint(-2 ** 31, 2 ** 31 - 1, (4096,), dtype=torch.int32)
    b = torch.randint(-2 ** 31, 2 ** 31 - 1, (4096,), dtype=torch.int32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int32)
        y = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.gt(fd.ops.add(x, y), 0))
        fd.add_output(fd.ops.mul(x, y))
        fd.add_output(fd.ops.neg(fd.ops.sub(x, y)))
    with meshfuser.Profiler() as prof:
        result = fd.execute([a.cuda(), b.cuda()])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["pointwise"]
    for r, e in zip(result, [(a + b) > 0, a * b, -(a - b)]):
        assert torch.equal(r.cpu(), e)


def test_integer_results_match_pytorch():
    """Integer powers, int64 products, a wrapped int32 sum read by later ops, and an int64 scalar
    meeting an int32 tensor: PyTorch's integer results."""
    a = torch.tensor([0, 2, 3, -7] * 16, dtype=torch.int32)
    b = torch.tensor([-1, 64, 41, 3] * 16, dtype=torch.int32)
    big = torch.full((4, 64), 2 ** 30, dtype=torch.int32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Int32)
        y = fd.define_tensor([-1], dtype=DataType.Int32)
        m = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        fd.add_output(fd.ops.pow(x, fd.ops.abs(y)))
        w = fd.ops.cast(fd.ops.mul(x, 2 ** 20), DataType.Int)
        fd.add_output(fd.ops.mul(w, w))
        s = fd.ops.sum(m, [1], dtype=DataType.Int32)
        fd.add_output(fd.ops.gt(s, 0))
        fd.add_output(fd.ops.maximum(x, 2 ** 32))
        fd.add_output(fd.ops.eq(x, 2 ** 32))
    expected = [a ** b.abs(), (a * 2 ** 20).long() * (a * 2 ** 20).long(), big.sum(1, dtype=torch.int32) > 0,
                torch.maximum(a, torch.tensor(0, dtype=torch.int32)), a == 0]
    result = fd.execute([a.cuda(), b.cuda(), big.cuda()])
    for r, e in zip(result, expected):
        assert torch.equal(r.cpu(), e), (r, e)


def test_integer_scalar_past_2_53_runs_on_aten():
    """Kernels take runtime scalars as doubles: 2^53 + 1 would arrive as 2^53. Such a call runs on
    ATen (exact), and the next call with a small scalar uses the kernel again."""
    a = torch.tensor([3, -5, 2 ** 31 - 1, 0] * 8, dtype=torch.int32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=DataType.Int32)
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.add(t, s))  # int32 result, wraps: + (2^53 + 1) is + 1
    for value, scheduler in [(2 ** 53 + 1, "expr_eval"), (-(2 ** 53) - 3, "expr_eval"), (7, "pointwise")]:
        reference = fd.execute([a, value])
        with meshfuser.Profiler() as prof:
            (result,) = fd.execute([a.cuda(), value])
        assert [k.scheduler for k in prof.profile.kernel_profiles] == [scheduler]
        assert torch.equal(result.cpu(), reference[0])
        assert torch.equal(result.cpu(), a + value)


def test_integer_pointwise_with_comparison_and_where():
    torch.manual_seed(0)
    a = torch.randint(-1000, 1000, (129, 65), dtype=torch.int32)
    b = torch.randint(-1000, 1000, (65,), dtype=torch.int32)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        y = fd.define_tensor([-1], dtype=DataType.Int32)
        s = fd.ops.add(fd.ops.mul(x, y), 7)
        fd.add_output(fd.ops.where(fd.ops.gt(s, 0), s, fd.ops.neg(s)))
        fd.add_output(fd.ops.div(x, y))
    reference = fd.execute([a, b])
    with meshfuser.Profiler() as prof:
        result = fd.execute([a.cuda(), b.cuda()])
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["pointwise"]
    torch.testing.assert_close(result[0].cpu(), reference[0], rtol=0, atol=0)
    torch.testing.assert_close(result[1].cpu(), reference[1], rtol=1.3e-6, atol=1e-5, equal_nan=True)


# ---- slice, pad and cat computed in generated kernels (codegen/resize.cpp), against PyTorch ----
RESIZE_DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def resize_tol(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}[dtype]


def rotate_half_fd(fd, t, shape):
    *lead, hd = shape
    first = fd.ops.slice(t, [0] * len(shape), [*lead, hd // 2])
    second = fd.ops.slice(t, [0] * (len(shape) - 1) + [hd // 2], [*lead, hd])
    return fd.ops.cat([fd.ops.neg(second), first], len(shape) - 1)


def rotate_half_torch(t):
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def run_generated(fd, inputs):
    """The fusion on CUDA tensors, with the schedulers of its segments."""
    with meshfuser.Profiler() as prof:
        out = fd.execute([t.cuda() for t in inputs])
    return out, [k.scheduler for k in prof.profile.kernel_profiles]


@pytest.mark.parametrize("dtype", list(RESIZE_DTYPES))
@pytest.mark.parametrize("b,s,h,hd", [(2, 128, 8, 128), (1, 77, 3, 64), (1, 5, 2, 6), (1, 33, 4, 80)])
def test_rope_rotate_half_is_one_kernel(dtype, b, s, h, hd):
    torch.manual_seed(0)
    q, cos, sin = torch.randn(b, s, h * hd, dtype=dtype), torch.randn(s, hd, dtype=dtype), torch.randn(s, hd, dtype=dtype)
    with FusionDefinition() as fd:
        tq = fd.define_tensor([b, s, h * hd], dtype=RESIZE_DTYPES[dtype])
        tc = fd.define_tensor([s, hd], dtype=RESIZE_DTYPES[dtype])
        ts = fd.define_tensor([s, hd], dtype=RESIZE_DTYPES[dtype])
        t = fd.ops.permute(fd.ops.reshape(tq, [b, s, h, hd]), [0, 2, 1, 3])
        out = fd.ops.add(fd.ops.mul(t, tc), fd.ops.mul(rotate_half_fd(fd, t, [b, h, s, hd]), ts))
        fd.add_output(fd.ops.cast(out, RESIZE_DTYPES[dtype]))
    (result,), schedulers = run_generated(fd, [q, cos, sin])
    assert schedulers == ["expr_eval", "pointwise"], schedulers  # the reshape is an ATen view
    tf = q.float().view(b, s, h, hd).transpose(1, 2)
    expected = (tf * cos.float() + rotate_half_torch(tf) * sin.float()).to(dtype)
    tol = resize_tol(dtype)
    torch.testing.assert_close(result.cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", list(RESIZE_DTYPES))
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("extents", [(8, 16), (3, 5, 8), (64, 64, 128)])
def test_cat_of_two_or_three_inputs(dtype, axis, extents):
    torch.manual_seed(0)
    shapes = [[4, 6, 8][:axis] + [e] + [4, 6, 8][axis + 1:] for e in extents]
    with FusionDefinition() as fd:
        xs = [fd.define_tensor(shape, dtype=RESIZE_DTYPES[dtype]) for shape in shapes]
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cat([fd.ops.exp(x) for x in xs], axis), 2.0), RESIZE_DTYPES[dtype]))
    ins = [torch.randn(shape, dtype=dtype) for shape in shapes]
    (result,), schedulers = run_generated(fd, ins)
    assert schedulers == ["pointwise"], schedulers
    expected = (torch.cat([x.float().exp() for x in ins], axis) * 2.0).to(dtype)
    torch.testing.assert_close(result.cpu(), expected, rtol=resize_tol(dtype), atol=resize_tol(dtype))


@pytest.mark.parametrize("dtype", list(RESIZE_DTYPES))
@pytest.mark.parametrize("widths", [[2, 3], [0, 0, 1, 1], [-2, 3, 1, -1], [8, 8], [-8, 0], [64, -64]])
def test_pad_and_negative_pad(dtype, widths):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 256], dtype=RESIZE_DTYPES[dtype])
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.pad(fd.ops.neg(x), widths, 1.5), 1.0), RESIZE_DTYPES[dtype]))
    ins = [torch.randn(6, 256, dtype=dtype)]
    (result,), schedulers = run_generated(fd, ins)
    assert schedulers == ["pointwise"], schedulers
    expected = (torch.nn.functional.pad(-ins[0].float(), widths, value=1.5) + 1.0).to(dtype)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", list(RESIZE_DTYPES))
@pytest.mark.parametrize("starts,ends,steps", [([0, 3], [5, 190], [1, 1]), ([1, 0], [6, 256], [2, 3]),
                                               ([0, 64], [6, 256], [1, 8]), ([2, 128], [4, 256], [1, 1])])
def test_slice_with_steps(dtype, starts, ends, steps):
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 256], dtype=RESIZE_DTYPES[dtype])
        fd.add_output(fd.ops.relu(fd.ops.slice(x, starts, ends, steps)))
    ins = [torch.randn(6, 256, dtype=dtype)]
    (result,), schedulers = run_generated(fd, ins)
    assert schedulers == ["pointwise"], schedulers
    expected = ins[0][starts[0]:ends[0]:steps[0], starts[1]:ends[1]:steps[1]].relu()
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", list(RESIZE_DTYPES))
def test_rms_norm_then_rope(dtype):
    # Llama: RMSNorm over the hidden size, the heads viewed and moved ahead, then RoPE; and an
    # RMSNorm over each head (q/k norm) right before the rotation.
    torch.manual_seed(0)
    b, s, h, hd = 2, 64, 4, 128
    x, w = torch.randn(b, s, h * hd, dtype=dtype), torch.randn(h * hd, dtype=dtype)
    cos, sin = torch.randn(s, hd, dtype=dtype), torch.randn(s, hd, dtype=dtype)
    dt = RESIZE_DTYPES[dtype]

    def rms(fd, t, axis, extent):
        ms = fd.ops.mul(fd.ops.sum(fd.ops.mul(t, t), [axis], keepdim=True), 1.0 / extent)
        return fd.ops.mul(t, fd.ops.rsqrt(fd.ops.add(ms, 1e-6)))

    with FusionDefinition() as fd:
        tx, tw = fd.define_tensor([b, s, h * hd], dtype=dt), fd.define_tensor([h * hd], dtype=dt)
        tc, ts = fd.define_tensor([s, hd], dtype=dt), fd.define_tensor([s, hd], dtype=dt)
        normed = fd.ops.cast(fd.ops.mul(rms(fd, fd.ops.cast(tx, DataType.Float), 2, h * hd), tw), dt)
        t = fd.ops.permute(fd.ops.reshape(normed, [b, s, h, hd]), [0, 2, 1, 3])
        t = rms(fd, t, 3, hd)
        rope = fd.ops.add(fd.ops.mul(t, tc), fd.ops.mul(rotate_half_fd(fd, t, [b, h, s, hd]), ts))
        fd.add_output(fd.ops.cast(rope, dt))
    (result,), schedulers = run_generated(fd, [x, w, cos, sin])
    # Generated kernels only, but for the reshape (an ATen view): the normalization kernel does not
    # resize yet, so the head norm and the rotation are a normalization and a pointwise kernel.
    assert schedulers.count("expr_eval") == 1 and set(schedulers) == {"normalization", "expr_eval", "pointwise"}, schedulers

    def rms_ref(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    n = (rms_ref(x.float()) * w.float()).to(dtype).float().view(b, s, h, hd).transpose(1, 2)
    n = rms_ref(n)
    expected = (n * cos.float() + rotate_half_torch(n) * sin.float()).to(dtype)
    tol = 2e-5 if dtype == torch.float32 else 3.2e-2
    torch.testing.assert_close(result.cpu(), expected, rtol=tol, atol=tol)
