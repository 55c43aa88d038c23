"""nvFuser users' habits in one process: the spellings its tests and Thunder's generated definitions
use (keyword arguments, fd.fusion.inputs(), broadcast, DataType.Null, the class style with a
multidevice_schedule), checked against PyTorch."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def test_fusion_inputs_and_outputs_are_the_defined_tensors():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        y = fd.define_tensor([-1, 4])
        total = fd.ops.add(x, y)
        fd.add_output(total)
        fd.add_output(x)
    assert [str(t) for t in fd.fusion.inputs()] == [str(x), str(y)]
    assert [str(t) for t in fd.fusion.outputs()] == [str(total), str(x)]
    # they are schedulable like the originals
    mesh = DeviceMesh([0])
    for tv in fd.fusion.inputs():
        tv.set_device_mesh(mesh)
    assert x.has_device_mesh() and y.has_device_mesh()


def test_broadcast_with_flags_then_squeeze():
    # nvFuser's broadcast(x, is_broadcast_dim): [3, 5, 6] -> [1, 3, 5, 6] -> squeeze -> sums
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1, -1), dtype=DataType.BFloat16)
        expanded = fd.ops.broadcast(inp, [True, False, False, False])
        as_float = fd.ops.cast(fd.ops.squeeze(expanded, dims=[0]), dtype=DataType.Float)
        fd.add_output(expanded)
        fd.add_output(fd.ops.sum(as_float, dims=[0]))
        fd.add_output(fd.ops.sum(as_float, dims=[1]))

    t = torch.randn(3, 5, 6, dtype=torch.bfloat16)
    expanded_t, sum0, sum1 = fd.execute([t])
    torch.testing.assert_close(expanded_t, t.unsqueeze(0))
    torch.testing.assert_close(sum0, t.float().sum(0))
    torch.testing.assert_close(sum1, t.float().sum(1))


def test_broadcast_flags_must_keep_every_input_axis():
    with pytest.raises(meshfuser.Error, match=r"broadcast: is_broadcast_dim \[True, False\] keeps 1 axes but T0"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, 4])
            fd.ops.broadcast(x, [True, False])


def test_thunder_style_keywords():
    # The spellings of Thunder's generated definitions: define_tensor(shape=, contiguity=, dtype=,
    # is_cpu=, stride_order=), reshape(new_shape=), permute(dims=), broadcast_in_dim(shape=,
    # broadcast_dims=), sum(dims=, keepdim=, dtype=DataType.Null).
    b, s, e = 2, 3, 4
    with FusionDefinition() as fd:
        inp = fd.define_tensor(shape=[b, s, e], contiguity=[True, True, True], dtype=DataType.BFloat16,
                               is_cpu=False, stride_order=[2, 1, 0])
        bias = fd.define_tensor(shape=[e], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
        flat = fd.ops.reshape(inp, new_shape=[b * s, e])
        transposed = fd.ops.permute(flat, dims=[1, 0])
        column_sums = fd.ops.sum(fd.ops.cast(transposed, dtype=DataType.Float), dims=[1], keepdim=False,
                                 dtype=DataType.Null)
        biased = fd.ops.add(fd.ops.cast(inp, dtype=DataType.Float),
                            fd.ops.cast(fd.ops.broadcast_in_dim(bias, shape=[b, s, e], broadcast_dims=[2]),
                                        dtype=DataType.Float))
        fd.add_output(column_sums)
        fd.add_output(fd.ops.cast(biased, dtype=DataType.BFloat16))

    x = torch.randn(b, s, e, dtype=torch.bfloat16)
    bias_t = torch.randn(e, dtype=torch.bfloat16)
    sums, out = fd.execute([x, bias_t])
    torch.testing.assert_close(sums, x.reshape(b * s, e).t().float().sum(1))
    torch.testing.assert_close(out, (x.float() + bias_t.float()).to(torch.bfloat16))


def test_reshape_takes_its_shape_once():
    with pytest.raises(meshfuser.Error, match="reshape: give the shape once"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([2, 6])
            fd.ops.reshape(x, [3, 4], new_shape=[3, 4])


def test_define_tensor_is_cpu_true_is_refused():
    with pytest.raises(meshfuser.Error, match="is_cpu=True is not supported"):
        with FusionDefinition() as fd:
            fd.define_tensor([], dtype=DataType.Float, is_cpu=True)


def test_class_style_with_multidevice_schedule_on_one_device():
    # nvFuser's older class style: definition() and multidevice_schedule() with self.sched; on a
    # one-device mesh the row-parallel linear is a local linear.
    class RowParallelLinear(FusionDefinition):
        def definition(self):
            self.inp = self.define_tensor([-1, 8])
            self.weight = self.define_tensor([3, 8])
            self.out = self.ops.linear(self.inp, self.weight)
            self.add_output(self.out)

        def multidevice_schedule(self):
            mesh = DeviceMesh([0])
            for t in [self.inp, self.weight]:
                self.sched._set_device_mesh(t, mesh)
                self.sched.split(t, -1, 1, False)
                self.sched.parallelize(t, -2, ParallelType.mesh_x)
            self.sched._set_device_mesh(self.out, mesh)

    x, w = torch.randn(5, 8), torch.randn(3, 8)
    (out,), shardings = RowParallelLinear().execute([x, w])
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w))
    assert shardings[0].axis_sharded_on(ParallelType.mesh_x) == -1


def test_half_arithmetic_keeps_half():
    # A documented difference (docs/nvfuser_differences.md): nvFuser returns Float here.
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1), dtype=DataType.Half)
        y = fd.define_tensor((-1, -1), dtype=DataType.Half)
        fd.add_output(fd.ops.add(x, y))
    a, b = torch.randn(4, 3, dtype=torch.half), torch.randn(4, 3, dtype=torch.half)
    (out,) = fd.execute([a, b])
    assert out.dtype == torch.half
    torch.testing.assert_close(out, a + b)
