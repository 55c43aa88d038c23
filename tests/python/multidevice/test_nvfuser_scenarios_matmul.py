"""nvFuser's multi-device matmul and DTensor scenarios (tests/python/multidevice/test_matmul.py and
test_dtensor.py in NVIDIA/Fuser) restated against meshfuser, and the regressions found while doing
so. See test_nvfuser_scenarios.py for the conventions."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds

MESH_X, MESH_Y, MESH_Z = ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z


def _kinds(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return communication_kinds([k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"])


def _mesh_or_skip(d, tp):
    """A [d/tp, tp] mesh (mesh_y = first axis, mesh_x = last), or skip when tp does not divide d."""
    if d % tp:
        pytest.skip(f"needs a rank count divisible by {tp}; got {d}")
    return DeviceMesh(torch.arange(d).view(d // tp, tp)), d // tp


def _shard_all(tvs, mesh, axis, loop_axis):
    for tv in tvs:
        tv.set_device_mesh(mesh)
        tv.outer_split(axis, mesh.size)
        tv.axis(loop_axis).parallelize(MESH_X)


# -- test_matmul.py --------------------------------------------------------------------------------
def test_linear_logical_split(multidevice_test):
    # The older style: the weight's output features are a logical axis of extent d, so the weight is
    # 3-D ([d, e, e]) and the output [d, b, s, e] carries the device axis first.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    b, s, e = 2, 4, 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([b, s, e])
        weight = fd.define_tensor([d, e, e], contiguity=True)
        bias = fd.define_tensor([d, e], contiguity=True)
        out = fd.ops.linear(inp, weight, bias)
        fd.add_output(out)
        for tv in [inp, weight, bias]:
            tv.set_device_mesh(mesh)
        for tv in [weight, bias]:
            tv.axis(0).parallelize(MESH_X)

    uinp, uw, ub = torch.randn(b, s, e), torch.randn(d, e, e), torch.randn(d, e)
    expected = torch.nn.functional.linear(uinp, uw.view(-1, e), ub.view(-1)).view(b, s, d, e).permute(2, 0, 1, 3)
    inputs = [multidevice_test.shard_tensor(t, tv) for t, tv in [(uinp, inp), (uw, weight), (ub, bias)]]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(expected, 0, multidevice_test.rank),
                               rtol=1.3e-6, atol=1e-4)
    assert _kinds(fd, inputs) == []


def test_column_parallel_linear_symbolic_batch(multidevice_test):
    # Weight and bias sharded on output features; the output's sharding comes from propagation.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    e = 16
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1, e])
        weight = fd.define_tensor([d * e, e])
        bias = fd.define_tensor([d * e])
        fd.add_output(fd.ops.linear(inp, weight, bias))
        inp.set_device_mesh(mesh)
        _shard_all([weight, bias], mesh, 0, 0)

    uinp, uw, ub = torch.randn(2, 3, e), torch.randn(d * e, e), torch.randn(d * e)
    inputs = [multidevice_test.shard_tensor(t, tv) for t, tv in [(uinp, inp), (uw, weight), (ub, bias)]]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(uinp, uw, ub)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(expected, -1, multidevice_test.rank),
                               rtol=1.3e-6, atol=1e-4)
    assert fd.get_output_shardings()[0].axis_sharded_on(MESH_X) == 2
    assert _kinds(fd, inputs) == []


@pytest.mark.parametrize("with_bias", [False, True])
def test_row_parallel_linear(multidevice_test, with_bias):
    # Input and weight sharded on the contracted axis: partial products and one Allreduce; the
    # bias is added once, after the reduction.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    e = 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1, d * e])
        weight = fd.define_tensor([e, d * e])
        bias = fd.define_tensor([e]) if with_bias else None
        out = fd.ops.linear(inp, weight, bias)
        fd.add_output(out)
        _shard_all([inp, weight], mesh, -1, -2)
        out.set_device_mesh(mesh)
        if with_bias:
            bias.set_device_mesh(mesh)

    uinp, uw, ub = torch.randn(2, 3, d * e), torch.randn(e, d * e), torch.randn(e)
    inputs = [multidevice_test.shard_tensor(uinp, inp), multidevice_test.shard_tensor(uw, weight)]
    if with_bias:
        inputs.append(ub.to(multidevice_test.device))
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(uinp, uw, ub if with_bias else None)
    torch.testing.assert_close(out_t.cpu(), expected, rtol=1.3e-6, atol=1e-4)
    assert _kinds(fd, inputs) == (["Allreduce"] if d > 1 else [])


def test_linear_reduce_scatter(multidevice_test):
    # Row-parallel linear whose output is sequence-sharded: a ReduceScatter, bias added after it.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    e = 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, d * 2, d * e])
        weight = fd.define_tensor([e, d * e])
        bias = fd.define_tensor([e])
        out = fd.ops.linear(inp, weight, bias)
        fd.add_output(out)
        bias.set_device_mesh(mesh)
        _shard_all([inp, weight, out], mesh, -1, -2)
        out.outer_split(1, d)
        out.axis(1).parallelize(MESH_X)

    uinp, uw, ub = torch.randn(2, d * 2, d * e), torch.randn(e, d * e), torch.randn(e)
    inputs = [multidevice_test.shard_tensor(uinp, inp), multidevice_test.shard_tensor(uw, weight),
              ub.to(multidevice_test.device)]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(uinp, uw, ub)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(expected, 1, multidevice_test.rank),
                               rtol=1.3e-6, atol=1e-4)
    assert _kinds(fd, inputs) == (["ReduceScatter"] if d > 1 else [])


def test_column_parallel_matmul(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    e = 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1, e])
        weight = fd.define_tensor([e, d * e])
        out = fd.ops.matmul(inp, weight)  # loop [b, s, n, r{k}]
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        _shard_all([weight], mesh, -1, -2)
        _shard_all([out], mesh, -2, -3)

    uinp, uw = torch.randn(2, 4, e), torch.randn(e, d * e)
    inputs = [multidevice_test.shard_tensor(uinp, inp), multidevice_test.shard_tensor(uw, weight)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(uinp @ uw, 2, multidevice_test.rank),
                               rtol=1.3e-6, atol=1e-4)
    assert _kinds(fd, inputs) == []


def test_row_parallel_matmul_with_rfactor(multidevice_test):
    # The user rFactors the reduction by hand: local partial products on each device, then a sum
    # over the device axis.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    e = 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, d * e], contiguity=True, dtype=DataType.Half)
        weight = fd.define_tensor([d * e, e], contiguity=True, dtype=DataType.Half)
        out = fd.ops.matmul(inp, weight)
        fd.add_output(out)
        for tv in [inp, weight, out]:
            tv.set_device_mesh(mesh)
        inp.outer_split(-1, d)
        inp.axis(-2).parallelize(MESH_X)
        weight.outer_split(0, d)
        weight.axis(0).parallelize(MESH_X)
        out.outer_split(-1, d)          # [m, n, r{d}, r{k/d}]
        partial = out.rfactor([-1])     # partial [m, n, d, r{k/d}], out [m, n, r{d}]
        partial.set_device_mesh(mesh)
        partial.axis(-2).parallelize(MESH_X)

    uinp, uw = torch.randn(4, d * e, dtype=torch.half), torch.randn(d * e, e, dtype=torch.half)
    inputs = [multidevice_test.shard_tensor(uinp, inp), multidevice_test.shard_tensor(uw, weight)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), (uinp.float() @ uw.float()).half(), rtol=1e-3, atol=1e-2)
    assert _kinds(fd, inputs) == (["Allreduce"] if d > 1 else [])


def test_issue4729_cast_mul_before_row_parallel_linear(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, 1, d * 3], dtype=DataType.BFloat16, contiguity=True)
        y = fd.define_tensor([1, 1, d * 3], dtype=DataType.BFloat16, contiguity=True)
        w = fd.define_tensor([-1, d * 3], dtype=DataType.BFloat16, contiguity=True)
        xy = fd.ops.cast(fd.ops.mul(fd.ops.cast(x, DataType.Float), fd.ops.cast(y, DataType.Float)),
                         DataType.BFloat16)
        fd.add_output(fd.ops.linear(xy, w))
        _shard_all([x, y, w], mesh, -1, -2)

    # small integers: every product and sum is exact in bfloat16
    ux, uy = [torch.randint(-2, 3, (1, 1, d * 3)).to(torch.bfloat16) for _ in range(2)]
    uw = torch.randint(-2, 3, (2, d * 3)).to(torch.bfloat16)
    inputs = [multidevice_test.shard_tensor(t, tv) for t, tv in [(ux, x), (uy, y), (uw, w)]]
    (z,) = fd.execute(inputs)
    torch.testing.assert_close(z.cpu(), torch.nn.functional.linear(ux * uy, uw))


def test_sequence_parallel_linear(multidevice_test):
    # Sequence-sharded input, column-sharded weight and bias, sequence-sharded output: the input is
    # gathered before the linear and the result is reshared on the sequence axis.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    b, s, e = 2, d * 4, d * 4
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1, -1], contiguity=True)
        weight = fd.define_tensor([-1, -1], contiguity=True)
        bias = fd.define_tensor([-1], contiguity=True)
        out = fd.ops.linear(inp, weight, bias)
        fd.add_output(out)
        _shard_all([inp, out], mesh, 1, 1)
        _shard_all([weight, bias], mesh, 0, 0)

    uinp, uw, ub = torch.randn(b, s, e), torch.randn(e, e), torch.randn(e)
    inputs = [multidevice_test.shard_tensor(t, tv) for t, tv in [(uinp, inp), (uw, weight), (ub, bias)]]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(uinp, uw, ub)
    torch.testing.assert_close(out_t.cpu(), multidevice_test.shard_tensor(expected, out).cpu(), rtol=1e-4, atol=1e-4)


def test_data_and_tensor_parallel_mlp(multidevice_test):
    # batch on mesh_y (data parallel), the MLP's hidden features on mesh_x (tensor parallel)
    d = multidevice_test.size
    mesh, dp = _mesh_or_skip(d, 2)
    e = 3
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1, e], contiguity=True)
        up_w = fd.define_tensor([4 * e, e], contiguity=True)
        down_w = fd.define_tensor([e, 4 * e], contiguity=True)
        fd.add_output(fd.ops.linear(fd.ops.linear(inp, up_w), down_w))
        for tv in [inp, up_w, down_w]:
            tv.set_device_mesh(mesh)
        inp.outer_split(0, dp)
        inp.axis(0).parallelize(MESH_Y)
        up_w.outer_split(0, 2)
        up_w.axis(0).parallelize(MESH_X)
        down_w.outer_split(-1, 2)
        down_w.axis(-2).parallelize(MESH_X)

    per_rank = 7
    # small integers: exact in float, so any summation order gives the same result
    uinp = torch.randint(-4, 5, (dp * per_rank, 5, e)).float()
    uup = torch.randint(-4, 5, (4 * e, e)).float()
    udown = torch.randint(-4, 5, (e, 4 * e)).float()
    inputs = [multidevice_test.shard_tensor(t, tv) for t, tv in [(uinp, inp), (uup, up_w), (udown, down_w)]]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(torch.nn.functional.linear(uinp, uup), udown)
    row = multidevice_test.rank // 2
    torch.testing.assert_close(out_t.cpu(), expected[row * per_rank:(row + 1) * per_rank])
    assert _kinds(fd, inputs) == ["Allreduce"]


# -- test_dtensor.py -------------------------------------------------------------------------------
def _torch_mesh(d, names=None):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(multidevice_device_type(), (d,), mesh_dim_names=names)


def multidevice_device_type():
    import os
    return "cuda" if torch.cuda.is_available() and os.environ.get("MESHFUSER_TEST_DEVICE", "cuda") == "cuda" else "cpu"


def test_dtensor_plus_one(setup_default_process_group, multidevice_test):
    from torch.distributed.tensor import Shard, distribute_tensor
    d = multidevice_test.size

    def define(fd):
        inp = fd.define_tensor((-1, -1), contiguity=False, dtype=DataType.Float)
        fd.add_output(fd.ops.add(inp, fd.define_scalar(1.0, dtype=DataType.Float)))

    mesh = _torch_mesh(d, ("tp",))
    x = distribute_tensor(torch.randn(d, 4).to(multidevice_test.device), mesh, [Shard(0)])
    out = meshfuser.dtensor.compile(define)(x)  # one output: a DTensor, not a list (meshfuser/dtensor.py)
    torch.testing.assert_close(out.to_local(), x.to_local() + 1)
    assert out.device_mesh == x.device_mesh and out.placements == x.placements
    assert out.device_mesh.mesh_dim_names == ("tp",)


@pytest.mark.parametrize("row", [False, True], ids=["column", "row"])
def test_dtensor_parallel_linear_forward(setup_default_process_group, multidevice_test, row):
    # nvFuser's test also runs the backward through its own autograd Function; meshfuser's DTensor
    # glue compiles forward programs (see docs/nvfuser_differences.md).
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    d, b, s, e = multidevice_test.size, 2, 3, 5

    def define(fd):
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.linear(x, w))

    mesh = _torch_mesh(d)
    ux = torch.randint(-4, 4, (b, s, d * e if row else e)).to(torch.bfloat16)
    uw = torch.randint(-4, 4, ((e, d * e) if row else (d * e, e))).to(torch.bfloat16)
    dev = multidevice_test.device
    x = distribute_tensor(ux.to(dev), mesh, [Shard(-1)] if row else [Replicate()])
    w = distribute_tensor(uw.to(dev), mesh, [Shard(-1)] if row else [Shard(0)])
    out = meshfuser.dtensor.compile(define)(x, w)  # one output: a DTensor
    expected = torch.nn.functional.linear(ux, uw)
    if row:
        torch.testing.assert_close(out.full_tensor().cpu(), expected)
    else:
        torch.testing.assert_close(out.to_local().cpu(), expected.split(e, dim=-1)[multidevice_test.rank])


# -- regressions found while restating the scenarios -----------------------------------------------
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_three_dimensional_weight_row_parallel(multidevice_test, with_bias):
    # A 3-D weight [a, n, k] with the contraction sharded: the output [a, m, n] (weight's leading
    # axis first, as test_linear_logical_split expects) is reduced across devices by one Allreduce.
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    a, n, k = 2, 4, d * 4
    with FusionDefinition() as fd:
        x = fd.define_tensor([k])
        w = fd.define_tensor([a, n, k])
        b = fd.define_tensor([a, n]) if with_bias else None
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        _shard_all([x, w], mesh, -1, -2)
        out.set_device_mesh(mesh)
        if with_bias:
            b.set_device_mesh(mesh)

    ux, uw, ub = torch.randn(k), torch.randn(a, n, k), torch.randn(a, n)
    inputs = [multidevice_test.shard_tensor(ux, x), multidevice_test.shard_tensor(uw, w)]
    if with_bias:
        inputs.append(ub.to(multidevice_test.device))
    (out_t,) = fd.execute(inputs)
    expected = torch.einsum("k,ank->an", ux, uw) + (ub if with_bias else 0)
    torch.testing.assert_close(out_t.cpu(), expected, rtol=1e-5, atol=1e-4)
    assert _kinds(fd, inputs) == (["Allreduce"] if d > 1 else [])


def test_linear_three_dimensional_weight_with_batch_axes_row_parallel(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    a, m, n, k = 2, 3, 4, d * 4
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([a, n, k])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        _shard_all([x, w], mesh, -1, -2)
        out.set_device_mesh(mesh)

    ux, uw = torch.randn(m, k), torch.randn(a, n, k)
    inputs = [multidevice_test.shard_tensor(ux, x), multidevice_test.shard_tensor(uw, w)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), torch.einsum("mk,ank->amn", ux, uw), rtol=1e-5, atol=1e-4)


def test_linear_two_dimensional_bias_after_device_reduction_with_batch_axes_is_an_error(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, d * 4])
        w = fd.define_tensor([2, 4, d * 4])
        b = fd.define_tensor([2, 4])
        fd.add_output(fd.ops.linear(x, w, b))
        _shard_all([x, w], mesh, -1, -2)
        b.set_device_mesh(mesh)

    inputs = [torch.randn(3, 4).to(multidevice_test.device), torch.randn(2, 4, 4).to(multidevice_test.device),
              torch.randn(2, 4).to(multidevice_test.device)]
    with pytest.raises(meshfuser.Error, match=r"2-D bias T2.*batch axes"):
        fd.execute(inputs)
