"""Tensor-parallel linear layers and matmuls: column-parallel (no communication), row-parallel
(one Allreduce), the Megatron MLP, and two schedules of the same ops giving two programs."""
import torch

import meshfuser
from meshfuser.testing import communication_kinds
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

RTOL, ATOL = 1.3e-6, 1e-4


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def _shard(tv, mesh, axis, loop_axis=None):
    """Mesh + outer split of `axis` by the mesh size, the DID on loop axis `loop_axis` (default
    `axis`; for a split of the last axis pass -2)."""
    tv.set_device_mesh(mesh)
    tv.split(axis, mesh.size, False)
    tv.axis(axis if loop_axis is None else loop_axis).parallelize(ParallelType.mesh_x)


def test_column_parallel_linear(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        w = fd.define_tensor([d * 8, 16])
        b = fd.define_tensor([d * 8])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        _shard(w, mesh, 0)
        _shard(b, mesh, 0)
        _shard(out, mesh, 1)  # out loop: [m, DIDx{d}, n/d, r{k}]

    ux, uw, ub = torch.randn(8, 16), torch.randn(d * 8, 16), torch.randn(d * 8)
    inputs = [ux.to(multidevice_test.device), multidevice_test.shard_tensor(uw, 0, mesh),
              multidevice_test.shard_tensor(ub, 0, mesh)]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(ux, uw, ub)
    assert out_t.shape == (8, 8)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(expected, 1, multidevice_test.rank), rtol=RTOL, atol=ATOL)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1
    assert _communications(fd, inputs) == []


def test_row_parallel_linear_with_bias(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, d * 8])
        w = fd.define_tensor([16, d * 8])
        b = fd.define_tensor([16])
        out = fd.ops.linear(x, w, b)
        fd.add_output(out)
        _shard(x, mesh, -1, -2)
        _shard(w, mesh, -1, -2)
        b.set_device_mesh(mesh)
        _shard(out, mesh, -1, -2)  # out loop: [m, n, rDIDx{d}, r{k/d}]

    ux, uw, ub = torch.randn(8, d * 8), torch.randn(16, d * 8), torch.randn(16)
    inputs = [multidevice_test.shard_tensor(ux, -1, mesh), multidevice_test.shard_tensor(uw, -1, mesh),
              ub.to(multidevice_test.device)]
    (out_t,) = fd.execute(inputs)
    expected = torch.nn.functional.linear(ux, uw, ub)
    torch.testing.assert_close(out_t.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == -1
    comms = _communications(fd, inputs)
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def test_row_parallel_matmul(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, d * 8])
        b = fd.define_tensor([d * 8, 16])
        out = fd.ops.matmul(a, b)
        fd.add_output(out)
        _shard(a, mesh, 1)
        _shard(b, mesh, 0)
        _shard(out, mesh, -1, -2)  # out loop: [m, n, rDIDx{d}, r{k/d}]

    ua, ub = torch.randn(8, d * 8), torch.randn(d * 8, 16)
    inputs = [multidevice_test.shard_tensor(ua, 1, mesh), multidevice_test.shard_tensor(ub, 0, mesh)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), ua @ ub, rtol=RTOL, atol=ATOL)
    comms = _communications(fd, inputs)
    if d > 1:
        assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def test_megatron_mlp(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        w1 = fd.define_tensor([d * 8, 16])
        b1 = fd.define_tensor([d * 8])
        w2 = fd.define_tensor([16, d * 8])
        h0 = fd.ops.linear(x, w1, b1)
        h = fd.ops.gelu(h0)
        out = fd.ops.linear(h, w2)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        _shard(w1, mesh, 0)
        _shard(b1, mesh, 0)
        _shard(h0, mesh, 1)
        _shard(h, mesh, 1)
        _shard(w2, mesh, 1)
        _shard(out, mesh, -1, -2)  # reduction axis split: [m, n, rDIDx{d}, r{k/d}]

    ux, uw1, ub1, uw2 = torch.randn(8, 16), torch.randn(d * 8, 16), torch.randn(d * 8), torch.randn(16, d * 8)
    inputs = [ux.to(multidevice_test.device), multidevice_test.shard_tensor(uw1, 0, mesh),
              multidevice_test.shard_tensor(ub1, 0, mesh), multidevice_test.shard_tensor(uw2, 1, mesh)]
    (out_t,) = fd.execute(inputs)
    F = torch.nn.functional
    expected = F.linear(F.gelu(F.linear(ux, uw1, ub1)), uw2)
    torch.testing.assert_close(out_t.cpu(), expected, rtol=1e-5, atol=1e-4)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == -1
    comms = _communications(fd, inputs)
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def test_megatron_mlp_propagated(multidevice_test):
    """Only the inputs and the output are annotated; propagation shards h."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        w1 = fd.define_tensor([d * 8, 16])
        b1 = fd.define_tensor([d * 8])
        w2 = fd.define_tensor([16, d * 8])
        h = fd.ops.gelu(fd.ops.linear(x, w1, b1))
        out = fd.ops.linear(h, w2)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        _shard(w1, mesh, 0)
        _shard(b1, mesh, 0)
        _shard(w2, mesh, 1)
        _shard(out, mesh, -1, -2)

    ux, uw1, ub1, uw2 = torch.randn(8, 16), torch.randn(d * 8, 16), torch.randn(d * 8), torch.randn(16, d * 8)
    inputs = [ux.to(multidevice_test.device), multidevice_test.shard_tensor(uw1, 0, mesh),
              multidevice_test.shard_tensor(ub1, 0, mesh), multidevice_test.shard_tensor(uw2, 1, mesh)]
    (out_t,) = fd.execute(inputs)
    F = torch.nn.functional
    expected = F.linear(F.gelu(F.linear(ux, uw1, ub1)), uw2)
    torch.testing.assert_close(out_t.cpu(), expected, rtol=1e-5, atol=1e-4)
    comms = _communications(fd, inputs)
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def _row_parallel(d, mesh, scatter):
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 4, d * 8])
        w = fd.define_tensor([16, d * 8])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        _shard(x, mesh, -1, -2)
        _shard(w, mesh, -1, -2)
        _shard(out, mesh, -1, -2)  # [m, n, rDIDx{d}, r{k/d}]
        if scatter:
            out.split(0, d, False)  # [DIDx{d}, m/d, n, rDIDx{d}, r{k/d}]
            out.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def test_same_ops_different_schedules(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    ux, uw = torch.randn(d * 4, d * 8), torch.randn(16, d * 8)
    inputs = [multidevice_test.shard_tensor(ux, -1, mesh), multidevice_test.shard_tensor(uw, -1, mesh)]
    expected = torch.nn.functional.linear(ux, uw)

    allreduce = _row_parallel(d, mesh, scatter=False)
    (out_ar,) = allreduce.execute(inputs)
    torch.testing.assert_close(out_ar.cpu(), expected, rtol=RTOL, atol=ATOL)

    scatter = _row_parallel(d, mesh, scatter=True)
    (out_rs,) = scatter.execute(inputs)
    assert out_rs.shape == (4, 16)
    torch.testing.assert_close(out_rs.cpu(), mesh.shard_tensor(expected, 0, multidevice_test.rank), rtol=RTOL, atol=ATOL)
    assert scatter.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 0

    # and back: the first program is still the first program
    (out_ar,) = allreduce.execute(inputs)
    torch.testing.assert_close(out_ar.cpu(), expected, rtol=RTOL, atol=ATOL)
    assert d == 1 or allreduce.host_program() != scatter.host_program()  # one device: both are a NoOp
    assert ("Allreduce" if d > 1 else "NoOp") in allreduce.host_program(), allreduce.host_program()
    assert ("ReduceScatter" if d > 1 else "NoOp") in scatter.host_program(), scatter.host_program()
    comms = _communications(scatter, inputs)
    assert communication_kinds(comms) == (["ReduceScatter"] if d > 1 else []), comms
