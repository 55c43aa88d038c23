"""The user's two seed programs: ReduceScatter with a DID loop split, and linear + ReduceScatter
decomposed into a local partial product and exactly one ReduceScatter."""
import pytest
import torch

import meshfuser
from meshfuser.testing import communication_kinds
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def test_reduce_scatter_loop_split(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))

    class Model(FusionDefinition):
        def definition(self):
            self.inp = self.define_tensor([d, d * 4, 3])
            self.out = self.ops.sum(self.inp, [0])
            self.add_output(self.out)

        def multidevice_schedule(self):
            self.sched._set_device_mesh(self.inp, mesh)
            self.sched._set_device_mesh(self.out, mesh)
            self.sched.split(self.inp, 0, d, False)
            self.sched.parallelize(self.inp, 0, ParallelType.mesh_x)
            # the reduced axis is split the same way; the output is scattered along axis 1
            self.sched.split(self.out, 0, d, False)
            self.sched.parallelize(self.out, 0, ParallelType.mesh_x)
            self.sched.split(self.out, -2, d, False)
            self.sched.parallelize(self.out, -3, ParallelType.mesh_x)

    unsharded = torch.randn(d, d * 4, 3)
    inp = multidevice_test.shard_tensor(unsharded, 0, mesh)
    fd = Model()
    (out,), shardings = fd.execute([inp])
    assert shardings[0].axis_sharded_on(ParallelType.mesh_x) == 0
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(unsharded.sum(0), 0, multidevice_test.rank))
    comms = _communications(fd, [inp])
    assert communication_kinds(comms) == (["ReduceScatter"] if d > 1 else []), comms


def test_linear_reduce_scatter(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    e = 16

    class Model(FusionDefinition):
        def definition(self):
            self.inp = self.define_tensor([-1, -1, d * e])
            self.weight = self.define_tensor([e, d * e])
            self.out = self.ops.linear(self.inp, self.weight, None)
            self.add_output(self.out)

        def multidevice_schedule(self):
            for t in [self.inp, self.weight, self.out]:
                self.sched._set_device_mesh(t, mesh)
                self.sched.split(t, -1, d, False)
                self.sched.parallelize(t, -2, ParallelType.mesh_x)
                self.sched.set_allocation_as_loop(t)
            self.sched.split(self.out, 1, d, False)
            self.sched.parallelize(self.out, 1, ParallelType.mesh_x)

    b, s = 2, 8 * d
    unsharded_inp = torch.randn(b, s, d * e)
    unsharded_weight = torch.randn(e, d * e)
    inp = multidevice_test.shard_tensor(unsharded_inp, -1, mesh)
    weight = multidevice_test.shard_tensor(unsharded_weight, -1, mesh)
    fd = Model()
    (out,), shardings = fd.execute([inp, weight])
    expected = torch.nn.functional.linear(unsharded_inp, unsharded_weight)
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(expected, 1, multidevice_test.rank), rtol=1.3e-6, atol=1e-3)
    assert shardings[0].axis_sharded_on(ParallelType.mesh_x) == 1
    comms = _communications(fd, [inp, weight])
    assert communication_kinds(comms) == (["ReduceScatter"] if d > 1 else []), comms
