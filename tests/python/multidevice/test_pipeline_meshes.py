"""Moves between different meshes: Gather (sharded on one mesh -> replicated on another) and
Scatter (replicated on one rank -> sharded over a mesh), plus a shard-to-shard SendRecv with the
device order reversed."""
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _set_program(d, in_mesh, out_mesh, in_sharded, out_sharded, shape):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape))
        y = fd.ops.set(x)
        z = fd.ops.mul(y, 2.0)
        fd.add_output(z)
    x.set_device_mesh(in_mesh)
    for tv in (y, z):
        tv.set_device_mesh(out_mesh)
    if in_sharded:
        x.outer_split(0, in_mesh.size)
        x.axis(0).parallelize(ParallelType.mesh_x)
    if out_sharded:
        for tv in (y, z):
            tv.outer_split(0, out_mesh.size)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def _local(t, mesh, sharded, rank):
    if not mesh.linear_index_of(rank) >= 0:
        return torch.empty(0)
    return mesh.shard_tensor(t, 0, rank) if sharded else t


def _check(multidevice_test, in_mesh, out_mesh, in_sharded, out_sharded):
    d, rank = multidevice_test.size, multidevice_test.rank
    shape = (d * 2 * out_mesh.size * in_mesh.size, 3)
    full = torch.randn(shape)
    fd = _set_program(d, in_mesh, out_mesh, in_sharded, out_sharded, shape)
    x = _local(full, in_mesh, in_sharded, rank)
    if in_mesh.linear_index_of(rank) < 0:
        x = torch.empty(0)  # this rank holds no part of the input; anything is accepted
    (out,) = fd.execute([x.to(multidevice_test.device)])
    if out_mesh.linear_index_of(rank) >= 0:
        expected = _local(full * 2, out_mesh, out_sharded, rank)
        torch.testing.assert_close(out.cpu(), expected)
    else:
        assert out.numel() == 0


def test_gather_to_last_rank(multidevice_test):
    d = multidevice_test.size
    _check(multidevice_test, DeviceMesh(range(d)), DeviceMesh([d - 1]), True, False)


def test_scatter_from_first_rank(multidevice_test):
    d = multidevice_test.size
    _check(multidevice_test, DeviceMesh([0]), DeviceMesh(range(d)), False, True)


def test_sendrecv_reversed_mesh(multidevice_test):
    d = multidevice_test.size
    _check(multidevice_test, DeviceMesh(range(d)), DeviceMesh(list(reversed(range(d)))), True, True)
