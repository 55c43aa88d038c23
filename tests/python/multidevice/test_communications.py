"""One test per row of the communication lowering table (docs/design.md section 6), plus the
Communicator's collectives used directly. Every rank builds the same unsharded reference from the
seeded RNG and checks its own shard."""
import pytest
import torch
import torch.distributed as dist

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.split(axis, mesh.size, False)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


# -- Allgather -------------------------------------------------------------------------------------
def _allgather_rows(mesh, shape):
    """out = set(inp), inp's rows sharded over the mesh, out replicated: one Allgather."""
    with FusionDefinition() as fd:
        inp = fd.define_tensor(shape)
        out = fd.ops.set(inp)
        fd.add_output(out)
        _shard(inp, mesh, 0)
        out.set_device_mesh(mesh)
    return fd


def test_allgather(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    fd = _allgather_rows(mesh, [d * 4, 5])
    unsharded = torch.randn(d * 4, 5)
    inp_t = multidevice_test.shard_tensor(unsharded, 0, mesh)
    (out_t,) = fd.execute([inp_t])
    torch.testing.assert_close(out_t.cpu(), unsharded)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == -1
    comms = _communications(fd, [inp_t])
    if d > 1:
        assert len(comms) == 1 and comms[0].startswith("Allgather"), comms


def test_host_program_labels_cuda_tensors_over_gloo(multidevice_test):
    """MESHFUSER_CUDA_BACKEND=gloo (ranks sharing a GPU) is a test mode, and the host program says
    so whenever CUDA tensors are communicated over Gloo; with NCCL or CPU tensors it says nothing."""
    import os
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    fd = _allgather_rows(mesh, [d * 2, 3])
    unsharded = torch.randn(d * 2, 3)
    (out_t,) = fd.execute([multidevice_test.shard_tensor(unsharded, 0, mesh)])
    torch.testing.assert_close(out_t.cpu(), unsharded)
    labelled = d > 1 and out_t.is_cuda and os.environ.get("MESHFUSER_CUDA_BACKEND") == "gloo"
    assert ("Communications of CUDA tensors run on Gloo" in fd.host_program()) == labelled, fd.host_program()


def test_allgather_non_outermost_axis(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([3, d * 4])
        out = fd.ops.set(inp)
        fd.add_output(out)
        _shard(inp, mesh, 1)
        out.set_device_mesh(mesh)

    unsharded = torch.randn(3, d * 4)
    inp_t = multidevice_test.shard_tensor(unsharded, 1, mesh)
    (out_t,) = fd.execute([inp_t])
    assert out_t.shape == (3, d * 4)
    torch.testing.assert_close(out_t.cpu(), unsharded)
    # a second run reuses the compiled program and still gives the same values
    (out_t,) = fd.execute([inp_t])
    torch.testing.assert_close(out_t.cpu(), unsharded)


# -- Allreduce -------------------------------------------------------------------------------------
def test_allreduce_logical_split(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d, 4])
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        out.axis(0).parallelize(ParallelType.mesh_x)

    unsharded = torch.randn(d, 4)
    inp_t = multidevice_test.shard_tensor(unsharded, 0, mesh)
    assert inp_t.shape == (1, 4)
    (out_t,) = fd.execute([inp_t])
    torch.testing.assert_close(out_t.cpu(), unsharded.sum(0))
    comms = _communications(fd, [inp_t])
    if d > 1:
        assert len(comms) == 1 and comms[0].startswith("Allreduce"), comms


def test_allreduce_loop_split(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 2, 4])
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        _shard(inp, mesh, 0)
        out.set_device_mesh(mesh)

    unsharded = torch.randn(d * 2, 4)
    inp_t = multidevice_test.shard_tensor(unsharded, 0, mesh)
    (out_t,) = fd.execute([inp_t])
    torch.testing.assert_close(out_t.cpu(), unsharded.sum(0))
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == -1
    comms = _communications(fd, [inp_t])
    if d > 1:
        assert len(comms) == 1 and comms[0].startswith("Allreduce"), comms


# -- ReduceScatter on a non-outermost axis ------------------------------------------------------------
def test_reduce_scatter_noncontiguous_axis(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d, 3, d * 4])
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        out.axis(0).parallelize(ParallelType.mesh_x)
        # out loop: [rDIDx{d}, 3, d*4] -> [rDIDx{d}, 3, DIDx{d}, 4]
        out.split(-1, d, False)
        out.axis(-2).parallelize(ParallelType.mesh_x)

    unsharded = torch.randn(d, 3, d * 4)
    inp_t = multidevice_test.shard_tensor(unsharded, 0, mesh)
    (out_t,) = fd.execute([inp_t])
    expected = mesh.shard_tensor(unsharded.sum(0), 1, multidevice_test.rank)
    assert out_t.shape == (3, 4)
    torch.testing.assert_close(out_t.cpu(), expected)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1
    comms = _communications(fd, [inp_t])
    if d > 1:
        assert len(comms) == 1 and comms[0].startswith("ReduceScatter"), comms


# -- AllToAll -------------------------------------------------------------------------------------
def test_alltoall(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 2, d * 3])
        out = fd.ops.set(inp)
        fd.add_output(out)
        _shard(inp, mesh, 0)
        # out loop: [d*2, DIDx{d}, 3]
        out.set_device_mesh(mesh)
        out.split(1, d, False)
        out.axis(1).parallelize(ParallelType.mesh_x)

    unsharded = torch.randn(d * 2, d * 3)
    inp_t = multidevice_test.shard_tensor(unsharded, 0, mesh)
    (out_t,) = fd.execute([inp_t])
    assert out_t.shape == (d * 2, 3)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(unsharded, 1, multidevice_test.rank))
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1
    comms = _communications(fd, [inp_t])
    if d > 1:
        assert len(comms) == 1 and comms[0].startswith("AllToAll"), comms


# -- replicated -> sharded: a local slice ---------------------------------------------------------------
def test_replicated_to_sharded_is_local(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 4, 5])
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        _shard(out, mesh, 0)

    unsharded = torch.randn(d * 4, 5)
    (out_t,) = fd.execute([unsharded.to(multidevice_test.device)])
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(unsharded, 0, multidevice_test.rank))
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 0
    comms = _communications(fd, [unsharded.to(multidevice_test.device)])
    assert all(c.startswith("LocalSlice") for c in comms), comms
    if d > 1:
        assert len(comms) >= 1, comms


# -- binary op of a replicated and a sharded tensor ----------------------------------------------------
def test_add_replicated_and_sharded(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        a = fd.define_tensor([d * 4, 6])
        b = fd.define_tensor([d * 4, 6])
        out = fd.ops.add(a, b)
        fd.add_output(out)
        a.set_device_mesh(mesh)
        _shard(b, mesh, 0)
        _shard(out, mesh, 0)

    ua, ub = torch.randn(d * 4, 6), torch.randn(d * 4, 6)
    (out_t,) = fd.execute([ua.to(multidevice_test.device), multidevice_test.shard_tensor(ub, 0, mesh)])
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(ua + ub, 0, multidevice_test.rank))


# -- pipeline between meshes ------------------------------------------------------------------------
def test_pipeline_between_meshes(multidevice_test):
    d = multidevice_test.size
    rank = multidevice_test.rank
    first, last = DeviceMesh([0]), DeviceMesh([d - 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        y = fd.ops.set(x)
        z = fd.ops.relu(y)
        fd.add_output(z)
        x.set_device_mesh(first)
        y.set_device_mesh(last)
        z.set_device_mesh(last)

    ux = torch.randn(4, 6)
    x_t = ux.to(multidevice_test.device) if rank == 0 else torch.empty(0, device=multidevice_test.device)
    (z_t,) = fd.execute([x_t])
    if rank == d - 1:
        torch.testing.assert_close(z_t.cpu(), torch.relu(ux))
    else:
        assert z_t.numel() == 0, z_t.shape


# -- the Communicator's collectives directly ----------------------------------------------------------
def test_communicator_allgather(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    comm = meshfuser.Communicator.instance()
    team = list(range(d))
    inp = torch.randn(d, 3, 5)[rank].contiguous().to(multidevice_test.device)
    out = torch.empty(d * 3, 5, device=multidevice_test.device)
    comm.allgather(team, out, inp).wait()
    expected = torch.empty(d * 3, 5, device=multidevice_test.device)
    dist.all_gather_into_tensor(expected, inp)
    torch.testing.assert_close(out, expected)


def test_communicator_reduce_scatter(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    comm = meshfuser.Communicator.instance()
    team = list(range(d))
    inp = torch.randn(d, d * 4, 3)[rank].contiguous().to(multidevice_test.device)
    out = torch.empty(4, 3, device=multidevice_test.device)
    comm.reduce_scatter(team, out, inp).wait()
    expected = torch.empty(4, 3, device=multidevice_test.device)
    dist.reduce_scatter_tensor(expected, inp.clone())
    torch.testing.assert_close(out, expected)


def test_communicator_allreduce(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    comm = meshfuser.Communicator.instance()
    team = list(range(d))
    t = torch.randn(d, 6, 2)[rank].contiguous().to(multidevice_test.device)
    expected = t.clone()
    comm.allreduce(team, t).wait()
    dist.all_reduce(expected)
    torch.testing.assert_close(t, expected)


def test_communicator_size_mismatch(multidevice_test):
    d = multidevice_test.size
    comm = meshfuser.Communicator.instance()
    team = list(range(d))
    dev = multidevice_test.device
    with pytest.raises(meshfuser.Error) as e:
        comm.allgather(team, torch.empty(d * 7 + 1, 3, device=dev), torch.empty(7, 3, device=dev))
    assert f"[{d * 7 + 1}, 3]" in str(e.value) and "[7, 3]" in str(e.value), str(e.value)
    with pytest.raises(meshfuser.Error) as e:
        comm.reduce_scatter(team, torch.empty(5, 2, device=dev), torch.empty(d * 5 + 3, 2, device=dev))
    assert f"[{d * 5 + 3}, 2]" in str(e.value) and "[5, 2]" in str(e.value), str(e.value)
    # nothing was posted: a real collective afterwards still completes
    t = torch.ones(4, device=dev)
    comm.allreduce(team, t).wait()
    torch.testing.assert_close(t, torch.full((4,), float(d), device=dev))
