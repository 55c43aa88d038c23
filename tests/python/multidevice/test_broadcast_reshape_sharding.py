"""Broadcasts and reshapes next to sharded tensors: a broadcast takes the sharding of the operand it
meets (no global-shape buffer, no communication), and a reshape whose output is sharded on an axis
that regroups the input's data slices locally instead of reshaping the whole tensor into a shard."""
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _run(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    return outputs, [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def _bias_add(multidevice_test, rows_per_rank):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        a = fd.define_tensor([d * rows_per_rank, 3])
        bias = fd.define_tensor([3])
        fd.add_output(fd.ops.add(a, fd.ops.broadcast_in_dim(bias, [d * rows_per_rank, 3], [1])))
    _shard(a, mesh, 0)
    bias.set_device_mesh(mesh)
    full, b = torch.randn(d * rows_per_rank, 3), torch.randn(3)
    dev = multidevice_test.device
    (out,), comms = _run(fd, [mesh.shard_tensor(full, 0, rank).to(dev), b.to(dev)])
    assert comms == []
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(full + b, 0, rank))


def test_bias_broadcast_next_to_a_sharded_operand(multidevice_test):
    _bias_add(multidevice_test, 2)


def test_bias_broadcast_with_one_row_per_rank(multidevice_test):
    # With one row per rank a global-shape broadcast used to broadcast silently to the wrong shape.
    _bias_add(multidevice_test, 1)


def test_weight_broadcast_against_a_sequence_sharded_activation(multidevice_test):
    # The affine step of a sequence-parallel LayerNorm: w [e] against x [b, s, e] split on s.
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b_, s, e = 2, 4 * d, 8
    with FusionDefinition() as fd:
        x = fd.define_tensor([b_, s, e])
        w = fd.define_tensor([e])
        fd.add_output(fd.ops.mul(x, fd.ops.broadcast_in_dim(w, [b_, s, e], [2])))
    _shard(x, mesh, 1)
    w.set_device_mesh(mesh)
    full, wt = torch.randn(b_, s, e), torch.randn(e)
    dev = multidevice_test.device
    (out,), comms = _run(fd, [mesh.shard_tensor(full, 1, rank).to(dev), wt.to(dev)])
    assert comms == []
    torch.testing.assert_close(out.cpu(), mesh.shard_tensor(full * wt, 1, rank))


def test_replicated_reshape_into_an_output_sharded_on_an_inner_axis(multidevice_test):
    # [4, 3] -> [2, 6] with the output split on axis 1: axis 1 regroups the input's data, so this
    # rank's block is sliced after the (local, replicated) reshape; nothing is communicated.
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 3 * d])
        out = fd.ops.reshape(x, [2, 6 * d])
        fd.add_output(out)
    x.set_device_mesh(mesh)
    _shard(out, mesh, 1)
    full = torch.randn(4, 3 * d)
    (res,), comms = _run(fd, [full.to(multidevice_test.device)])
    assert all(c.startswith("LocalSlice") for c in comms), comms
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full.reshape(2, 6 * d), 1, rank))
