"""Single-process (mesh-less) fusions compared against PyTorch on the same unsharded tensors."""
import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType

DTYPES = {torch.float32: DataType.Float, torch.float16: DataType.Half, torch.bfloat16: DataType.BFloat16}
FLOAT_DTYPES = list(DTYPES)
DTYPE_IDS = ["f32", "f16", "bf16"]


def _run(build, inputs):
    """Defines a fusion with `build(fd)` (returns the outputs), executes it on `inputs`."""
    with FusionDefinition() as fd:
        outs = build(fd)
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(o)
    return fd, fd.execute(inputs)


def _check(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape, (a.shape, e.shape)
        torch.testing.assert_close(a, e)  # checks dtype too; default tolerances per dtype


# -- pointwise ops -------------------------------------------------------------------------------

UNARY = {
    "neg": (torch.neg, False),
    "abs": (torch.abs, False),
    "exp": (torch.exp, False),
    "log": (torch.log, True),
    "tanh": (torch.tanh, False),
    "relu": (torch.relu, False),
    "gelu": (F.gelu, False),
    "sigmoid": (torch.sigmoid, False),
    "sqrt": (torch.sqrt, True),
    "reciprocal": (torch.reciprocal, False),
    "silu": (F.silu, False),
    "rsqrt": (torch.rsqrt, True),
    "erf": (torch.erf, False),
    "sin": (torch.sin, False),
    "cos": (torch.cos, False),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, dtype):
    torch.manual_seed(0)
    ref, positive = UNARY[name]
    x = torch.randn(4, 5)
    x = (x.abs() + 0.1 if positive else x).to(dtype)
    _, out = _run(lambda fd: getattr(fd.ops, name)(fd.define_tensor([4, 5], dtype=DTYPES[dtype])), [x])
    _check(out, [ref(x)])


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, dtype):
    torch.manual_seed(0)
    a = torch.randn(4, 5)
    b = torch.randn(4, 5)
    if name == "pow":
        a = a.abs() + 0.5  # positive base
    if name == "div":
        b = b.sign() * (b.abs() + 0.5)  # away from zero
    b = torch.where(torch.rand(4, 5) > 0.5, a, b)  # some equal elements for the comparisons
    a, b = a.to(dtype), b.to(dtype)
    dt = DTYPES[dtype]
    _, out = _run(lambda fd: getattr(fd.ops, name)(fd.define_tensor([4, 5], dtype=dt), fd.define_tensor([4, 5], dtype=dt)),
                  [a, b])
    _check(out, [BINARY[name](a, b)])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_with_python_scalar(name, dtype):
    torch.manual_seed(0)
    x = torch.rand(4, 5) + 0.25  # positive (pow base, div denominator)
    x[0, :2] = 0.5  # equal elements for the comparisons
    x = x.to(dtype)
    op = BINARY[name]

    def build(fd):
        t = fd.define_tensor([4, 5], dtype=DTYPES[dtype])
        return [getattr(fd.ops, name)(t, 0.5), getattr(fd.ops, name)(0.5, t)]

    _, out = _run(build, [x])
    s = torch.tensor(0.5, dtype=dtype)  # a 0-dim tensor promotes like a Python scalar
    _check(out, [op(x, s), op(s, x)])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_where(dtype):
    torch.manual_seed(0)
    c = torch.rand(4, 5) > 0.5
    a, b = torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    dt = DTYPES[dtype]

    def build(fd):
        tc = fd.define_tensor([4, 5], dtype=DataType.Bool)
        ta, tb = fd.define_tensor([4, 5], dtype=dt), fd.define_tensor([4, 5], dtype=dt)
        return [fd.ops.where(tc, ta, tb), fd.ops.where(fd.ops.gt(ta, tb), ta, 0.0)]

    _, out = _run(build, [c, a, b])
    _check(out, [torch.where(c, a, b), torch.where(a > b, a, torch.zeros((), dtype=dtype))])


@pytest.mark.parametrize("dst", FLOAT_DTYPES + [torch.float64, torch.int64], ids=DTYPE_IDS + ["f64", "i64"])
@pytest.mark.parametrize("src", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_cast(src, dst):
    torch.manual_seed(0)
    x = (torch.randn(4, 5) * 10).to(src)
    dst_dt = {**DTYPES, torch.float64: DataType.Double, torch.int64: DataType.Int}[dst]
    _, out = _run(lambda fd: fd.ops.cast(fd.define_tensor([4, 5], dtype=DTYPES[src]), dst_dt), [x])
    _check(out, [x.to(dst)])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_python_scalars(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=dtype)

    def build(fd):
        t = fd.define_tensor([4, 5], dtype=DTYPES[dtype])
        return [fd.ops.mul(t, 2.0), fd.ops.add(3, t), fd.ops.sub(1.5, t), fd.ops.div(t, 4), t * 0.5 + 1, -t]

    _, out = _run(build, [x])
    _check(out, [x * 2.0, 3 + x, 1.5 - x, x / 4, x * 0.5 + 1, -x])


def test_symbolic_shapes():
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.tanh(fd.ops.add(a, b)))
        fd.add_output(fd.ops.sum(a, [1]))
    for shape in [(3, 4), (7, 2)]:
        x, y = torch.randn(shape), torch.randn(shape)
        _check(fd.execute([x, y]), [torch.tanh(x + y), x.sum(1)])


# -- broadcasting and shape ops ------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [([4, 5], [5]), ([5], [4, 5]), ([4, 1], [1, 5]), ([2, 1, 5], [3, 1])])
def test_broadcasting(sa, sb):
    torch.manual_seed(0)
    a, b = torch.randn(sa), torch.randn(sb)
    _, out = _run(lambda fd: [fd.ops.add(fd.define_tensor(sa), fd.define_tensor(sb))], [a, b])
    _check(out, [a + b])


@pytest.mark.parametrize("in_shape,shape,dims", [([5], [4, 5], [1]), ([4], [4, 3], [0]), ([4, 1], [4, 6], [0, 1]),
                                                 ([2, 3], [2, 4, 3], [0, 2])])
def test_broadcast_in_dim(in_shape, shape, dims):
    torch.manual_seed(0)
    x = torch.randn(in_shape)
    _, out = _run(lambda fd: fd.ops.broadcast_in_dim(fd.define_tensor(in_shape), shape, dims), [x])
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = in_shape[i]
    _check(out, [x.reshape(view).expand(shape)])


def test_broadcast_in_dim_then_add():
    torch.manual_seed(0)
    x, y = torch.randn(5), torch.randn(4, 5)
    _, out = _run(lambda fd: fd.ops.add(fd.ops.broadcast_in_dim(fd.define_tensor([5]), [4, 5], [1]), fd.define_tensor([4, 5])),
                  [x, y])
    _check(out, [x + y])


@pytest.mark.parametrize("shape,dims", [([3, 1, 4], [1]), ([1, 3, 1], [0, 2]), ([3, 1], [-1])])
def test_squeeze(shape, dims):
    torch.manual_seed(0)
    x = torch.randn(shape)
    _, out = _run(lambda fd: fd.ops.squeeze(fd.define_tensor(shape), dims), [x])
    expected = x
    for d in sorted((d % len(shape) for d in dims), reverse=True):
        expected = expected.squeeze(d)
    _check(out, [expected])


@pytest.mark.parametrize("dims", [[2, 0, 1], [1, 0, 2], [0, 1, 2], [-1, 0, 1]])
def test_permute(dims):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    _, out = _run(lambda fd: fd.ops.permute(fd.define_tensor([2, 3, 4]), dims), [x])
    _check(out, [x.permute(dims)])


@pytest.mark.parametrize("shape", [[6, 4], [4, -1], [24], [2, 12], [1, 24], [2, 3, 2, 2]])
def test_reshape(shape):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    _, out = _run(lambda fd: fd.ops.reshape(fd.define_tensor([2, 3, 4]), shape), [x])
    _check(out, [x.reshape(shape)])


# -- reductions ----------------------------------------------------------------------------------

REDUCTIONS = {"sum": lambda x, d, k: x.sum(d, keepdim=k), "max": lambda x, d, k: x.amax(d, keepdim=k),
              "min": lambda x, d, k: x.amin(d, keepdim=k)}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", [[1], [0, 2], [-1], [0, 1, 2]])
@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_reduction(op, dims, keepdim, dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=dtype)
    _, out = _run(lambda fd: getattr(fd.ops, op)(fd.define_tensor([3, 4, 5], dtype=DTYPES[dtype]), dims, keepdim=keepdim),
                  [x])
    _check(out, [REDUCTIONS[op](x, dims, keepdim)])


def test_linear_with_a_three_dimensional_weight_and_bias():
    x, w, b = torch.randn(3, 5, 8), torch.randn(2, 4, 8), torch.randn(2, 4)

    def define(fd):
        return fd.ops.linear(fd.define_tensor([3, 5, 8]), fd.define_tensor([2, 4, 8]), fd.define_tensor([2, 4]))
    _, out = _run(define, [x, w, b])
    # the weight's leading axis leads the output, as in nvFuser: [2, 3, 5, 4]
    _check(out, [F.linear(x, w.reshape(8, 8), b.reshape(8)).reshape(3, 5, 2, 4).permute(2, 0, 1, 3)])


def test_sum_keepdim_next_to_a_broadcast_axis():
    # x is defined [-1, 1]: its second axis is a broadcast axis that keepdim keeps as it is.
    x = torch.randn(5, 1)
    _, out = _run(lambda fd: fd.ops.sum(fd.define_tensor([-1, 1]), [0], keepdim=True), [x])
    _check(out, [x.sum(0, keepdim=True)])


@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_bf16_to_float(keepdim):
    torch.manual_seed(0)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    _, out = _run(lambda fd: fd.ops.sum(fd.define_tensor([8, 16], dtype=DataType.BFloat16), [1], keepdim=keepdim,
                                        dtype=DataType.Float), [x])
    _check(out, [torch.sum(x, [1], keepdim=keepdim, dtype=torch.float32)])


# -- matmul and linear ---------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [([3, 4], [4, 5]), ([2, 3, 4], [4, 5]), ([2, 3, 4], [2, 4, 5])])
def test_matmul(sa, sb):
    torch.manual_seed(0)
    a, b = torch.randn(sa), torch.randn(sb)
    _, out = _run(lambda fd: fd.ops.matmul(fd.define_tensor(sa), fd.define_tensor(sb)), [a, b])
    _check(out, [torch.matmul(a, b)])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_shape", [[3, 4], [2, 3, 4]])
def test_linear(x_shape, bias):
    torch.manual_seed(0)
    x, w, b = torch.randn(x_shape), torch.randn(5, 4), torch.randn(5)

    def build(fd):
        tx, tw = fd.define_tensor(x_shape), fd.define_tensor([5, 4])
        return fd.ops.linear(tx, tw, fd.define_tensor([5]) if bias else None)

    _, out = _run(build, [x, w, b] if bias else [x, w])
    _check(out, [F.linear(x, w, b if bias else None)])


# -- class style ---------------------------------------------------------------------------------

class _Mlp(FusionDefinition):
    def definition(self):
        self.x = self.define_tensor([-1, 4])
        self.w = self.define_tensor([6, 4])
        self.b = self.define_tensor([6])
        self.h = self.ops.relu(self.ops.linear(self.x, self.w, self.b))
        self.out = self.ops.sum(self.h, [1])
        self.add_output(self.h)
        self.add_output(self.out)


def test_class_style():
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4), torch.randn(6, 4), torch.randn(6)
    result = _Mlp().execute([x, w, b])
    assert isinstance(result, tuple) and len(result) == 2
    outputs, shardings = result
    h = torch.relu(F.linear(x, w, b))
    _check(outputs, [h, h.sum(1)])
    assert len(shardings) == 2
    assert all(s.axis_sharded_on(ParallelType.mesh_x) == -1 for s in shardings)


# -- cache and fingerprints ----------------------------------------------------------------------

def _exp_add(fd):
    a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
    return fd.ops.exp(fd.ops.add(a, b))


def test_cache_hit_and_new_signature():
    torch.manual_seed(0)
    meshfuser._C.clear_caches()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    fd, out = _run(_exp_add, [x, y])
    _check(out, [torch.exp(x + y)])
    assert fd._handle.num_executors() == 1
    _check(fd.execute([x, y]), [torch.exp(x + y)])
    assert fd._handle.num_executors() == 1  # hit
    x2, y2 = torch.randn(5, 2), torch.randn(5, 2)
    _check(fd.execute([x2, y2]), [torch.exp(x2 + y2)])
    assert fd._handle.num_executors() == 1  # other extents, same shape class: reused
    xt = torch.randn(4, 3).t()  # another stride order: a new shape class
    _check(fd.execute([xt, y]), [torch.exp(xt + y)])
    assert fd._handle.num_executors() == 2
    # A second, identical definition shares the cache (same fingerprint).
    fd2, out2 = _run(_exp_add, [x, y])
    _check(out2, [torch.exp(x + y)])
    assert meshfuser._C.num_cached_definitions() == 1
    assert fd2._handle.num_executors() == 2


def test_cache_dtype_signature():
    torch.manual_seed(0)
    meshfuser._C.clear_caches()
    x = torch.randn(3, 4)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_tensor([3, 4]), fd.define_scalar(dtype=DataType.Double)))
    _check(fd.execute([x, 2.0]), [x * 2.0])
    n = fd._handle.num_executors()
    _check(fd.execute([x, 3.0]), [x * 3.0])
    assert fd._handle.num_executors() == n
    _check(fd.execute([x, 3]), [x * 3.0])  # int scalar: a different signature
    assert fd._handle.num_executors() == n + 1


def _relu_4x8(schedule):
    with FusionDefinition() as fd:
        tv = fd.define_tensor([4, 8])
        out = fd.ops.relu(tv)
        fd.add_output(out)
        if schedule:
            for t in [tv, out]:
                t.set_device_mesh(DeviceMesh([0]))
                t.outer_split(1, 1)
                t.axis(1).parallelize(ParallelType.mesh_x)
    return fd


def test_fingerprints():
    plain1, plain2 = _relu_4x8(False), _relu_4x8(False)
    sched1, sched2 = _relu_4x8(True), _relu_4x8(True)
    assert plain1.fusion.fingerprint() == plain2.fusion.fingerprint()
    assert sched1.fusion.fingerprint() == sched2.fusion.fingerprint()
    assert plain1.fusion.fingerprint() != sched1.fusion.fingerprint()
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    _check(plain1.execute([x]), [torch.relu(x)])
    _check(sched1.execute([x]), [torch.relu(x)])  # one-device mesh: the local shard is the whole tensor
    assert sched1.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1


def test_scheduling_after_definition_changes_fingerprint():
    fd = _relu_4x8(False)
    before = fd.fusion.fingerprint()
    x = torch.randn(4, 8)
    _check(fd.execute([x]), [torch.relu(x)])
    for i in range(2):
        t = fd.fusion.input(0) if i == 0 else fd.fusion.output(0)
        t.set_device_mesh(DeviceMesh([0]))
        t.outer_split(1, 1)
        t.axis(1).parallelize(ParallelType.mesh_x)
    assert fd.fusion.fingerprint() != before
    _check(fd.execute([x]), [torch.relu(x)])
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1


# -- printing and profiling ----------------------------------------------------------------------

def _many_ops(fd):
    a, b = fd.define_tensor([4, 6]), fd.define_tensor([6])
    c = fd.ops.exp(fd.ops.add(a, b))
    d = fd.ops.permute(fd.ops.reshape(c, [2, 2, 6]), [2, 0, 1])
    e = fd.ops.sum(d, [0])
    f = fd.ops.linear(fd.ops.cast(a, DataType.Float), fd.define_tensor([3, 6]))
    return [e, fd.ops.max(f, [1]), fd.ops.where(fd.ops.gt(a, 0.0), a, b)]


def test_print_is_deterministic_and_names_ops():
    fd1, _ = _run(_many_ops, [torch.randn(4, 6), torch.randn(6), torch.randn(3, 6)])
    with FusionDefinition() as fd2:
        for o in _many_ops(fd2):
            fd2.add_output(o)
    text = str(fd1)
    assert text == str(fd2)
    for name in ["exp", "add", "reshape", "permute", "sum", "linear", "cast", "max", "where", "gt"]:
        assert name in text, name


def test_profiler_records_expr_eval():
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_tensor([3, 4]), fd.define_tensor([3, 4])))
    with meshfuser.Profiler() as prof:
        out = fd.execute([x, y])
    _check(out, [x * y])
    assert "expr_eval" in [k.scheduler for k in prof.profile.kernel_profiles]
    assert meshfuser.PythonProfiler is meshfuser.Profiler


def test_constants_that_differ_beyond_six_digits_are_different_programs():
    """The definition's fingerprint keys the executor cache, so constants must print exactly."""
    def build(c):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1], dtype=DataType.Double)
            fd.add_output(fd.ops.mul(x, c))
        return fd

    x = torch.ones(3, dtype=torch.float64)
    a, b = build(1.0000001), build(1.0000002)
    assert a.fusion.fingerprint() != b.fusion.fingerprint()
    torch.testing.assert_close(a.execute([x])[0], x * 1.0000001, rtol=0, atol=0)
    torch.testing.assert_close(b.execute([x])[0], x * 1.0000002, rtol=0, atol=0)


def test_tensor_comparisons_build_bool_tensors():
    # `a == 0` is a bool tensor (nvFuser's semantics), not Python's identity test that where() would
    # have taken as the constant False; a TensorView has no truth value.
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        fd.add_output(fd.ops.where(a == 0, a, -a))
        fd.add_output(a != 1)
        fd.add_output(a < 1.5)
        fd.add_output(a >= 2)
        fd.add_output(a ** 2)
        fd.add_output(2.0 / (a + 1))
        fd.add_output(abs(a - 1))
    x = torch.tensor([0.0, 1.0, 2.0, 0.0])
    expected = [torch.where(x == 0, x, -x), x != 1, x < 1.5, x >= 2, x ** 2, 2.0 / (x + 1), (x - 1).abs()]
    for got, want in zip(fd.execute([x]), expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    with pytest.raises(meshfuser.Error, match="no truth value"):
        with FusionDefinition() as fd:
            a = fd.define_tensor([-1])
            if a == 0:
                pass


def test_broadcast_in_dim_to_concrete_extents_over_symbolic_axes():
    # A symbolic input axis under a concrete output extent expands from 1 (PyTorch's expand) or must
    # equal it; the output once kept the input's extent: (3, 1) -> [2, 3, 4] gave (2, 3, 1).
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        b = fd.ops.broadcast_in_dim(t, [2, 3, 4], [1, 2])
        fd.add_output(b)
        fd.add_output(fd.ops.sum(b, [2]))
    for shape in [(3, 1), (3, 4)]:
        x = torch.randn(*shape)
        out, total = fd.execute([x])
        torch.testing.assert_close(out, x.expand(2, 3, 4))
        torch.testing.assert_close(total, x.expand(2, 3, 4).sum(2))
    with pytest.raises(meshfuser.Error, match=r"input axis 1 of T0 has extent 5 but output axis 2 asks for 4"):
        fd.execute([torch.randn(3, 5)])


def test_sum_with_a_dtype_converts_each_element_first():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(a, [1], dtype=DataType.Int32))
        fd.add_output(fd.ops.sum(a, [0], dtype=DataType.Double))
    x = torch.rand(5, 7) * 3
    got_int, got_double = fd.execute([x])
    assert torch.equal(got_int, torch.sum(x, 1, dtype=torch.int32))
    assert got_double.dtype == torch.float64
    torch.testing.assert_close(got_double, torch.sum(x, 0, dtype=torch.float64))



@pytest.mark.parametrize("a_dtype,b_dtype", [
    (torch.int32, torch.int64), (torch.float16, torch.float32), (torch.int32, torch.float64),
    (torch.bool, torch.int32), (torch.float32, torch.float64), (torch.bfloat16, torch.float16)])
def test_zero_dim_tensors_promote_like_pytorch(a_dtype, b_dtype):
    # A 0-dim tensor only counts when it is of a higher category: int32[2] + int64[] is int32
    # (it was int64, with the values of an int64 add), half[2] + float32[] is half.
    dtypes = {torch.int32: DataType.Int32, torch.int64: DataType.Int, torch.float16: DataType.Half,
              torch.float32: DataType.Float, torch.float64: DataType.Double, torch.bfloat16: DataType.BFloat16,
              torch.bool: DataType.Bool}
    torch.manual_seed(0)
    a, b = (torch.rand(2) * 4).to(a_dtype), (torch.rand(()) * 4).to(b_dtype)
    with FusionDefinition() as fd:
        ta = fd.define_tensor([-1], dtype=dtypes[a_dtype])
        tb = fd.define_tensor([], dtype=dtypes[b_dtype])
        fd.add_output(fd.ops.add(ta, tb))
        fd.add_output(fd.ops.mul(tb, ta))
    for got, want in zip(fd.execute([a, b]), [a + b, b * a]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scalar_first_operands_of_half_tensors_compute_in_float(dtype):
    # 70000.0 * h once cast 70000 to half first (inf); the order of the operands must not matter.
    dt = {torch.float16: DataType.Half, torch.bfloat16: DataType.BFloat16}[dtype]
    h = torch.tensor([0.5, 0.25, -0.125, 4.0], dtype=dtype)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], dtype=dt)
        fd.add_output(fd.ops.mul(70000.0, t))
        fd.add_output(fd.ops.div(1e5, t))
        fd.add_output(fd.ops.sub(3.3, t))
        fd.add_output(fd.ops.mul(0.1, t))
    want = [h * 70000.0, (1e5 / h.float()).to(dtype), (3.3 - h.float()).to(dtype), h * 0.1]
    for got, w in zip(fd.execute([h]), want):
        assert got.dtype == dtype
        assert torch.equal(got, w)
