"""Schedules nvFuser accepts: a symbolic logical device axis, and split -> rfactor -> parallelize
(the rfactor before the mesh axes are assigned). Each checks the plan and the numbers."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds


def _comms(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    return outputs, [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def test_symbolic_logical_device_axis(multidevice_test):
    # define_tensor([-1, 3]) with axis 0 on mesh_x: its extent is the mesh size, one row per device.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3])
        out = fd.ops.set(fd.ops.relu(x))
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
    full = torch.randn(d, 3)
    (res,), comms = _comms(fd, [full[rank:rank + 1].to(dev)])
    assert communication_kinds(comms) == (["Allgather"] if d > 1 else []), comms
    torch.testing.assert_close(res.cpu(), torch.relu(full))


def test_symbolic_device_axis_needs_extent_one_per_device(multidevice_test):
    d, dev = multidevice_test.size, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3])
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(mesh)
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match="each device holds extent 1 of it, but got 2"):
        fd.execute([torch.randn(2, 3).to(dev)])


def _split_rfactor_parallelize(d, parallelize_partial=True):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 2, 3])
        out = fd.ops.sum(x, [0])
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        out.outer_split(0, d)            # [r{d}, r{2}, 3]
        partial = out.rfactor([1])       # partial: [i{d}rf, r{2}rf, 3]; out: [r{d}, 3]
        if parallelize_partial:
            partial.axis(0).parallelize(ParallelType.mesh_x)
        out.axis(0).parallelize(ParallelType.mesh_x)
    return fd, mesh


def test_split_rfactor_then_parallelize(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    fd, mesh = _split_rfactor_parallelize(d)
    full = torch.randn(d * 2, 3)
    (res,), comms = _comms(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms
    torch.testing.assert_close(res.cpu(), full.sum(0))


def test_rfactor_left_serial_is_an_error(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    fd, mesh = _split_rfactor_parallelize(d, parallelize_partial=False)
    with pytest.raises(meshfuser.Error, match="outer part of a split reduction that was rfactored"):
        fd.execute([mesh.shard_tensor(torch.randn(d * 2, 3), 0, rank).to(dev)])


def test_stream_parallel_axis_is_refused(multidevice_test):
    # A stream loop overlaps a linear with its communication; on a relu it would not be honoured,
    # so it is refused rather than silently ignored (tests/python/multidevice/test_overlap.py).
    d, dev = multidevice_test.size, multidevice_test.device
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 3])
        out = fd.ops.relu(x)
        fd.add_output(out)
        x.set_device_mesh(DeviceMesh(range(d)))
        out.set_device_mesh(DeviceMesh(range(d)))
        out.outer_split(0, 2)
        out.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(meshfuser.Error, match="ParallelType.stream on T1 axis 0 cannot be streamed"):
        fd.execute([torch.randn(4 * d, 3).to(dev)])


@pytest.mark.parametrize("gather", [False, True], ids=["sharded_out", "gathered_out"])
def test_linear_with_a_three_dimensional_weight(multidevice_test, gather):
    # The weight's output features split logically into [d, n/d]: sharded on the first axis, the
    # linear runs locally; gathering its output is one Allgather.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    m, n_per, k = 5, 4, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        w = fd.define_tensor([d, n_per, k])
        b = fd.define_tensor([d, n_per])
        y = fd.ops.linear(x, w, b)
        out = fd.ops.set(y) if gather else y
        fd.add_output(out)
        x.set_device_mesh(mesh)
        for tv in (w, b, y):
            tv.set_device_mesh(mesh)
        w.axis(0).parallelize(ParallelType.mesh_x)
        b.axis(0).parallelize(ParallelType.mesh_x)
        y.axis(0).parallelize(ParallelType.mesh_x)  # y: [d, m, n/d], as in nvFuser
        if gather:
            out.set_device_mesh(mesh)
    ux, uw, ub = torch.randn(m, k), torch.randn(d, n_per, k), torch.randn(d, n_per)
    (res,), comms = _comms(fd, [ux.to(dev), uw[rank:rank + 1].to(dev), ub[rank:rank + 1].to(dev)])
    expected = torch.nn.functional.linear(ux, uw.reshape(d * n_per, k), ub.reshape(-1)).reshape(m, d, n_per)
    expected = expected.permute(1, 0, 2)
    if gather:
        assert communication_kinds(comms) == (["Allgather"] if d > 1 else []), comms
        torch.testing.assert_close(res.cpu(), expected, rtol=1.3e-6, atol=1e-4)
    else:
        assert comms == []
        torch.testing.assert_close(res.cpu(), expected[rank:rank + 1], rtol=1.3e-6, atol=1e-4)
