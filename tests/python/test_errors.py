"""One test per user error: each raises meshfuser.Error with a message naming the input or tensor,
the axis, the expected and the actual value."""
import os

import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _fusion(shapes, build=None, dtype=DataType.Float):
    """A fusion with inputs of `shapes` (T0, T1, ...) and output build(fd, *inputs) (default: first + 1)."""
    with FusionDefinition() as fd:
        ins = [fd.define_tensor(s, dtype=dtype) for s in shapes]
        fd.add_output(build(fd, *ins) if build else fd.ops.add(ins[0], 1.0))
    return fd


def _assert_runs(fd, inputs, expected):
    """The same fusion accepts correct inputs (so the error really comes from the bad one)."""
    (out,) = fd.execute(inputs)
    torch.testing.assert_close(out, expected)


# -- execute-time input validation ---------------------------------------------------------------

def test_wrong_number_of_inputs():
    fd = _fusion([[2, 3], [2, 3]], lambda fd, a, b: fd.ops.add(a, b))
    x = torch.randn(2, 3)
    with pytest.raises(meshfuser.Error, match=r"expected 2 inputs but got 1"):
        fd.execute([x])
    with pytest.raises(meshfuser.Error, match=r"expected 2 inputs but got 3"):
        fd.execute([x, x, x])
    _assert_runs(fd, [x, x], x + x)


def test_wrong_dtype():
    fd = _fusion([[2, 3], [2, 3]], lambda fd, a, b: fd.ops.add(a, b))
    x = torch.randn(2, 3)
    with pytest.raises(meshfuser.Error, match=r"input 1 \(T1\) has dtype Half but the definition expects float"):
        fd.execute([x, x.half()])
    _assert_runs(fd, [x, x], x + x)


def test_wrong_rank():
    fd = _fusion([[-1, -1]])
    x = torch.randn(2, 3, 4)
    with pytest.raises(meshfuser.Error, match=r"input 0 \(T0\) has 3 dimensions but the definition has 2"):
        fd.execute([x])
    _assert_runs(fd, [x[0]], x[0] + 1)


def test_wrong_extent_on_concrete_axis():
    fd = _fusion([[4, 5]])
    x = torch.randn(4, 6)
    with pytest.raises(meshfuser.Error,
                       match=r"input 0 \(T0\) axis 1: expected local extent 5 .*but got 6 \(input shape \[4, 6\]\)"):
        fd.execute([x])
    _assert_runs(fd, [x[:, :5]], x[:, :5] + 1)


def test_symbolic_extent_mismatch_between_operands():
    # a + b with a, b both [-1, 3]: the runtime extents of the broadcast-joined axis 0 must agree.
    fd = _fusion([[-1, 3], [-1, 3]], lambda fd, a, b: fd.ops.add(a, b))
    with pytest.raises(meshfuser.Error, match=r"T1.*axis 0.*\b2\b.*\b5\b|T1.*axis 0.*\b5\b.*\b2\b"):
        fd.execute([torch.randn(2, 3), torch.randn(5, 3)])


def test_scalar_where_tensor_expected():
    fd = _fusion([[2, 3]])
    with pytest.raises(meshfuser.Error, match=r"input 0 \(T0\) must be a tensor but got a scalar"):
        fd.execute([1.0])


def test_tensor_where_scalar_expected():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_tensor([2, 3]), fd.define_scalar(dtype=DataType.Double)))
    x = torch.randn(2, 3)
    with pytest.raises(meshfuser.Error, match=r"input 1 must be a scalar \(double\) but got a tensor"):
        fd.execute([x, x])
    _assert_runs(fd, [x, 3.0], x * 3.0)


def test_execute_non_tensor_input():
    fd = _fusion([[2, 3]])
    with pytest.raises(meshfuser.Error, match=r"input 0 is a .*str.*; expected a torch.Tensor or a Python number") as e:
        fd.execute(["x"])
    assert isinstance(e.value, ValueError)


# -- definition-time errors ----------------------------------------------------------------------

def test_linear_in_features_mismatch():
    with pytest.raises(meshfuser.Error, match=r"linear: input T0 has in_features 4 .*weight T1 has 5"):
        _fusion([[3, 4], [6, 5]], lambda fd, x, w: fd.ops.linear(x, w))


def test_linear_bias_mismatch():
    with pytest.raises(meshfuser.Error, match=r"linear: bias T2 has 7 features but weight T1 has out_features 6"):
        _fusion([[3, 4], [6, 4], [7]], lambda fd, x, w, b: fd.ops.linear(x, w, b))


def test_matmul_k_mismatch():
    with pytest.raises(meshfuser.Error, match=r"matmul: contraction extents differ: T0 has K = 4 .*T1 has K = 5"):
        _fusion([[3, 4], [5, 6]], lambda fd, a, b: fd.ops.matmul(a, b))


def test_binary_extent_mismatch():
    with pytest.raises(meshfuser.Error, match=r"add: operand 1 \(T1\) has extent 4 at output axis 1 but another "
                                              r"operand has 3"):
        _fusion([[2, 3], [2, 4]], lambda fd, a, b: fd.ops.add(a, b))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dim", [2, -3])
def test_reduction_dim_out_of_range(op, dim):
    assert issubclass(meshfuser.ArgumentError, ValueError)
    assert issubclass(meshfuser.ArgumentError, meshfuser.Error)
    with pytest.raises(meshfuser.Error, match=rf"{op}: dim {dim} is out of range for T0 of rank 2") as e:
        _fusion([[2, 3]], lambda fd, x: getattr(fd.ops, op)(x, [0, dim]))
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, meshfuser.ArgumentError)


def test_reduction_dim_twice():
    with pytest.raises(meshfuser.ArgumentError, match=r"sum: dim -1 of T0 is given twice"):
        _fusion([[2, 3]], lambda fd, x: fd.ops.sum(x, [1, -1]))


@pytest.mark.parametrize("axis", [2, -3])
def test_split_axis_out_of_range(axis):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        with pytest.raises(meshfuser.Error, match=rf"split: axis {axis} is out of range for T0 whose loop domain has "
                                                  r"2 axes") as e:
            x.split(axis, 2)
        assert isinstance(e.value, ValueError)


def test_parallelize_without_mesh():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        out = fd.ops.relu(x)
        fd.add_output(out)
        x.outer_split(1, 1)
        x.axis(1).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match=r"T0.*parallelized on DIDx.*no device mesh.*set_device_mesh"):
        fd.execute([torch.randn(4, 8)])


def test_device_axis_extent_differs_from_mesh_size():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        out = fd.ops.relu(x)
        fd.add_output(out)
        for t in [x, out]:
            t.set_device_mesh(DeviceMesh([0]))
            t.outer_split(1, 2)
            t.axis(1).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match=r"T\d: loop axis 1 .*parallelized on DIDx with extent 2 but the mesh has 1 "
                                              r"devices along DIDx; expected extent 1"):
        fd.execute([torch.randn(4, 8)])


def test_input_without_mesh_in_multidevice_fusion():
    with FusionDefinition() as fd:
        x, y = fd.define_tensor([4, 8]), fd.define_tensor([4, 8])
        out = fd.ops.add(x, y)
        fd.add_output(out)
        for t in [x, out]:
            t.set_device_mesh(DeviceMesh([0]))
    with pytest.raises(meshfuser.Error, match=r"fusion input T1 has no device mesh while T\d has mesh \[0\]"):
        fd.execute([torch.randn(4, 8), torch.randn(4, 8)])


@pytest.mark.parametrize("devices", [[0, 1, 1], [2, 0, 2, 3]])
def test_device_mesh_duplicate_ranks(devices):
    dup = next(d for d in devices if devices.count(d) > 1)
    with pytest.raises(meshfuser.Error, match=rf"DeviceMesh: device {dup} appears more than once") as e:
        DeviceMesh(devices)
    assert isinstance(e.value, ValueError)


def test_device_mesh_negative_rank():
    with pytest.raises(meshfuser.ArgumentError, match=r"DeviceMesh: device ids must be non-negative ranks; got -1"):
        DeviceMesh([0, -1])


@pytest.mark.parametrize("shape,count", [([4, 2], 8), ([5], 5), ([2, 2, 2], 8)])
def test_reshape_wrong_element_count(shape, count):
    with pytest.raises(meshfuser.Error, match=rf"reshape: T0 has shape \[2, 3\] \(6 elements\) but the new shape has "
                                              rf"{count} elements"):
        _fusion([[2, 3]], lambda fd, x: fd.ops.reshape(x, shape))


def test_reshape_cannot_infer():
    with pytest.raises(meshfuser.Error, match=r"reshape: cannot infer -1 for T0 of shape \[2, 3\] into 4-element"):
        _fusion([[2, 3]], lambda fd, x: fd.ops.reshape(x, [4, -1]))


def test_squeeze_non_one_axis():
    with pytest.raises(meshfuser.Error, match=r"squeeze: axis 1 of T0 has extent 3; only extent-1 axes can be squeezed"):
        _fusion([[2, 3, 1]], lambda fd, x: fd.ops.squeeze(x, [2, 1]))


def test_squeeze_symbolic_axis():
    with pytest.raises(meshfuser.Error, match=r"squeeze: axis 0 of T0 has extent \w+; only extent-1 axes"):
        _fusion([[-1, 3]], lambda fd, x: fd.ops.squeeze(x, [0]))


def test_permute_not_a_permutation():
    with pytest.raises(meshfuser.Error, match=r"permute: dims must be a permutation of 0..2"):
        _fusion([[2, 3, 4]], lambda fd, x: fd.ops.permute(x, [0, 0, 1]))


def test_add_output_of_scalar():
    with FusionDefinition() as fd:
        s = fd.define_scalar(2.0)
        with pytest.raises(meshfuser.Error, match=r"add_output: only tensors can be outputs; got scalar") as e:
            fd.add_output(s)
        assert isinstance(e.value, ValueError)


def test_execute_without_outputs():
    with FusionDefinition() as fd:
        fd.ops.relu(fd.define_tensor([2, 3]))
    with pytest.raises(meshfuser.Error, match=r"execute: the fusion has no outputs; call add_output"):
        fd.execute([torch.randn(2, 3)])


def test_op_on_python_number_where_tensor_expected():
    with FusionDefinition() as fd:
        fd.define_tensor([2, 3])
        with pytest.raises(meshfuser.Error, match=r"cast: expected a TensorView; got float"):
            fd.ops.cast(2.0, DataType.Half)
        with pytest.raises(meshfuser.Error, match=r"matmul: expected a TensorView; got float"):
            fd.ops.matmul(2.0, 3)
        # Elementwise ops take scalars too and give a scalar (tests/python/test_nvfuser_api_gaps.py).
        assert "6" in repr(fd.ops.mul(2.0, 3))


def test_unknown_dump_option():
    old = os.environ.get("MESHFUSER_DUMP")
    try:
        os.environ["MESHFUSER_DUMP"] = "nonsense"
        with pytest.raises(meshfuser.Error, match=r"MESHFUSER_DUMP: unknown option 'nonsense'; valid options are: "
                                                  r".*fusion_ir.*host_program"):
            meshfuser._C.reload_options()
    finally:
        if old is None:
            os.environ.pop("MESHFUSER_DUMP", None)
        else:
            os.environ["MESHFUSER_DUMP"] = old
        meshfuser._C.reload_options()


def test_errors_are_not_internal():
    assert issubclass(meshfuser.Error, RuntimeError)
    assert not issubclass(meshfuser.InternalError, meshfuser.Error)
    fd = _fusion([[2, 3]])
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([torch.randn(3, 3)])
    assert not isinstance(e.value, meshfuser.InternalError)
    assert "internal error" not in str(e.value)


def test_broadcast_in_dim_to_a_float_scalar_extent_is_an_argument_error():
    # Runtime extents are integers (fd.ops.shape/size, integer scalars): tests/python/test_nvfuser_api_gaps.py.
    with FusionDefinition() as fd:
        w = fd.define_tensor([8])
        s = fd.define_scalar(dtype=DataType.Double)
        with pytest.raises(meshfuser.Error,
                           match=r"broadcast_in_dim: shape axis 0 must be an integer; got a double scalar") as e:
            fd.ops.broadcast_in_dim(w, [s, 8], [1])
        assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("op", ["sum", "max", "min", "var_mean"])
def test_reduction_with_no_axes_is_an_error(op):
    # torch.sum(x, dim=[]) reduces every axis, nvFuser refuses; returning x unchanged was silent.
    with pytest.raises(meshfuser.Error, match="no axis to reduce of T0"):
        with FusionDefinition() as fd:
            getattr(fd.ops, op)(fd.define_tensor([-1, -1]), [])


def test_integer_constant_past_2_53_is_an_error():
    with pytest.raises(meshfuser.Error, match=r"the integer constant 9007199254740993 is past 2\^53.*9007199254740992"):
        with FusionDefinition() as fd:
            fd.ops.add(fd.define_tensor([-1], dtype=DataType.Int), 2 ** 53 + 1)
    with FusionDefinition() as fd:  # 2^53 itself is exact
        t = fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.add(t, 2 ** 53))
    assert fd.execute([torch.tensor([1])])[0].item() == 2 ** 53 + 1


def test_where_with_a_non_bool_condition_is_an_error():
    with pytest.raises(meshfuser.Error, match="where: the condition T0 has dtype float; it must be bool"):
        with FusionDefinition() as fd:
            t = fd.define_tensor([-1])
            fd.ops.where(t, t, 0.0)


def test_integer_to_a_negative_integer_power_is_an_error():
    with pytest.raises(meshfuser.Error, match="integers to negative integer powers are not allowed"):
        with FusionDefinition() as fd:
            fd.ops.pow(fd.define_tensor([-1], dtype=DataType.Int32), -2)


# -- runtime scalars and values of other definitions -----------------------------------------------

def test_runtime_scalar_of_the_wrong_kind():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=DataType.Int)
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(a, s))
    x = torch.ones(2, dtype=torch.long)
    with pytest.raises(meshfuser.Error, match=r"input 1 \(S\d+\) is an integer scalar \(int64\) but got a float \(2.7"):
        fd.execute([x, 2.7])
    assert torch.equal(fd.execute([x, 3])[0], x * 3)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        flag = fd.define_scalar(dtype=DataType.Bool)
        fd.add_output(fd.ops.where(flag, a, fd.ops.neg(a)))
    y = torch.randn(4)
    with pytest.raises(meshfuser.Error, match=r"input 1 \(S\d+\) is a bool scalar but got an integer \(1"):
        fd.execute([y, 1])
    assert torch.equal(fd.execute([y, False])[0], -y)


def test_integer_to_a_negative_runtime_integer_power():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=DataType.Int)
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.pow(a, s))
    x = torch.tensor([2, 3])
    with pytest.raises(meshfuser.Error, match="runtime exponent -1 is a negative integer; integers to negative"):
        fd.execute([x, -1])
    assert torch.equal(fd.execute([x, 3])[0], x ** 3)


def test_values_of_another_definition():
    with FusionDefinition() as fd1:
        a = fd1.define_tensor([2])
    with FusionDefinition() as fd2:
        b = fd2.define_tensor([2])
        with pytest.raises(meshfuser.Error, match="belongs to another fusion definition"):
            fd2.ops.add(a, b)
        with pytest.raises(meshfuser.Error, match="belongs to another fusion definition"):
            fd2.ops.add(b, a)
        with pytest.raises(meshfuser.Error, match="belongs to another fusion definition"):
            fd2.ops.mul(a, 2.0)  # the constant is made in fd2, the tensor is fd1's
        with pytest.raises(meshfuser.Error, match="add_output: T\\d+.* belongs to another fusion definition"):
            fd2.add_output(a)
        fd2.add_output(fd2.ops.neg(b))
    x = torch.randn(2)
    assert torch.equal(fd2.execute([x])[0], -x)


def test_unknown_cuda_backend_is_a_clear_error(monkeypatch):
    from meshfuser import distributed
    monkeypatch.setenv("MESHFUSER_CUDA_BACKEND", "mpi")
    with pytest.raises(meshfuser.Error, match="MESHFUSER_CUDA_BACKEND='mpi': expected 'nccl'"):
        distributed._cuda_backend()
