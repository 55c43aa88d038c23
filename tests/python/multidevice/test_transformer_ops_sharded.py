"""Transformer-layer ops on sharded tensors (1-4 ranks): slice, cat and pad along unsharded axes
stay local; along the sharded axis they gather first; var_mean over a sharded axis is partial sums
plus Allreduces; reshapes that split or merge a sharded axis stay local; where shards like any
pointwise op. Each test asserts the communications and bytes of this rank and its shard of the
unsharded PyTorch result."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import execute_with_plan

F32 = 4
pytestmark = pytest.mark.timeout(60)


_plan = execute_with_plan


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _replicate(tv, mesh):
    tv.set_device_mesh(mesh)


def _expect(d, *comms):
    return list(comms) if d > 1 else []


def _allgather(d, local_bytes):
    return ("Allgather", (d - 1) * local_bytes, (d - 1) * local_bytes)


def test_slice_along_an_unsharded_axis_stays_local(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 8])
        out = fd.ops.slice(x, [0, 2], [2 * d, 7], [1, 2])
        fd.add_output(out)
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 8)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full[:, 2:7:2], 0, rank))


def test_slice_along_the_sharded_axis_gathers_first(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 3])
        out = fd.ops.slice(x, [1, 0], [4 * d - 1, 3])
        fd.add_output(out)
        _shard(x, mesh, 0)
    full = torch.randn(4 * d, 3)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == _expect(d, _allgather(d, 4 * 3 * F32))
    torch.testing.assert_close(res.cpu(), full[1:-1])


def test_cat_along_an_unsharded_axis_stays_local(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([2 * d, 3]), fd.define_tensor([2 * d, 5])
        out = fd.ops.cat([a, b], 1)
        fd.add_output(out)
        _shard(a, mesh, 0)
        _shard(b, mesh, 0)
    fa, fb = torch.randn(2 * d, 3), torch.randn(2 * d, 5)
    (res,), comms = _plan(fd, [mesh.shard_tensor(t, 0, rank).to(dev) for t in (fa, fb)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.cat([fa, fb], 1), 0, rank))


def test_cat_along_the_sharded_axis_gathers_then_slices(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([2 * d, 3]), fd.define_tensor([d, 3])
        out = fd.ops.cat([a, b], 0)
        fd.add_output(out)
        for t in (a, b, out):
            _shard(t, mesh, 0)
    fa, fb = torch.randn(2 * d, 3), torch.randn(d, 3)
    (res,), comms = _plan(fd, [mesh.shard_tensor(t, 0, rank).to(dev) for t in (fa, fb)])
    # Each input gathered once; the sharded result is a local slice of the concatenation.
    assert sorted(comms) == sorted(_expect(d, _allgather(d, 2 * 3 * F32), _allgather(d, 3 * F32), ("LocalSlice", 0, 0)))
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.cat([fa, fb], 0), 0, rank))


def test_pad_along_an_unsharded_axis_stays_local(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 4])
        out = fd.ops.pad(x, [1, 2], 0.5)
        fd.add_output(out)
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 4)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.nn.functional.pad(full, [1, 2], value=0.5), 0, rank))


def test_var_mean_over_the_sharded_axis_allreduces_partial_sums(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    m, k = 3, 4 * d
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([m, k])
        var, mean = fd.ops.var_mean(x, [1])
        fd.add_output(var)
        fd.add_output(mean)
        _shard(x, mesh, 1)
    full = torch.randn(m, k) + 10
    (res_var, res_mean), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
    partial = m * F32  # one partial sum per row, for the mean and again for the squared deviations
    allreduce = ("Allreduce", 2 * (d - 1) * partial // d, 2 * (d - 1) * partial // d)
    assert comms == _expect(d, allreduce, allreduce)
    ref_var, ref_mean = torch.var_mean(full, [1])
    torch.testing.assert_close(res_mean.cpu(), ref_mean)
    torch.testing.assert_close(res_var.cpu(), ref_var)


def test_var_mean_over_an_unsharded_axis_stays_local(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 6])
        var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
        fd.add_output(var)
        fd.add_output(mean)
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 6)
    (res_var, res_mean), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == []
    ref_var, ref_mean = torch.var_mean(full, [1], correction=0, keepdim=True)
    torch.testing.assert_close(res_var.cpu(), mesh.shard_tensor(ref_var, 0, rank))
    torch.testing.assert_close(res_mean.cpu(), mesh.shard_tensor(ref_mean, 0, rank))


def test_heads_merge_back_stays_local(multidevice_test):
    # [t, heads, dim] sharded on heads -> [t, heads*dim] sharded on the merged axis, no communication.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    t, heads, dim = 3, 2 * d, 4
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, heads, dim])
        out = fd.ops.reshape(x, [t, heads * dim])
        fd.add_output(out)
        _shard(x, mesh, 1)
    full = torch.randn(t, heads, dim)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full.reshape(t, heads * dim), 1, rank))


def test_symbolic_heads_split_stays_local(multidevice_test):
    # A symbolic sequence axis: [s, heads*dim] sharded on the merged axis -> [s, heads, dim].
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    heads, dim = 2 * d, 4
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, heads * dim])
        out = fd.ops.reshape(x, [fd.ops.size(x, 0), heads, -1])
        fd.add_output(out)
        _shard(x, mesh, 1)
    for t in (3, 5):
        full = torch.randn(t, heads * dim)
        (res,), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
        assert comms == []
        torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full.reshape(t, heads, dim), 1, rank))


def test_where_with_broadcast_operands_shards_like_pointwise(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        c = fd.define_tensor([2 * d, 1], dtype=meshfuser.DataType.Bool)
        a = fd.define_tensor([2 * d, 5])
        b = fd.define_tensor([5])
        out = fd.ops.where(c, a, b)
        fd.add_output(out)
        _shard(c, mesh, 0)
        _shard(a, mesh, 0)
        _replicate(b, mesh)
    fc, fa, fb = torch.randn(2 * d, 1) > 0, torch.randn(2 * d, 5), torch.randn(5)
    inputs = [mesh.shard_tensor(fc, 0, rank).to(dev), mesh.shard_tensor(fa, 0, rank).to(dev), fb.to(dev)]
    (res,), comms = _plan(fd, inputs)
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.where(fc, fa, fb), 0, rank))


def test_slice_bounds_that_differ_between_ranks_are_an_error_on_every_rank(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    if d < 2:
        pytest.skip("needs 2+ ranks")
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([2 * d, 6])
        end = fd.define_scalar(dtype=meshfuser.DataType.Int)
        out = fd.ops.slice(x, [0, 1], [2 * d, end])
        fd.add_output(out)
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 6)
    shard = mesh.shard_tensor(full, 0, rank).to(dev)
    # Negative bounds (from the end) are values like any other: -2 against -1 or 5 differ too.
    for mine, others in [(4, 5), (-2, -1), (-1, 5)]:
        with pytest.raises(meshfuser.Error, match=r"ranks pass different values for the integer scalar S0 \(input 1\)"):
            fd.execute([shard, mine if rank == 0 else others])
    (res,), comms = _plan(fd, [shard, 5])  # the ranks agree again: the program runs
    assert comms == []
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full[:, 1:5], 0, rank))
    (res,), _ = _plan(fd, [shard, -1])  # a negative bound agreed by every rank: x[:, 1:-1]
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(full[:, 1:-1], 0, rank))


def test_rotary_halves_with_heads_sharded_and_symbolic_sequence(multidevice_test):
    # RoPE's rotate_half on [batch, heads, seq, dim] sharded on heads, seq symbolic: local on every rank.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    b, heads, dim = 2, 2 * d, 8
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, heads, -1, dim])
        seq = fd.ops.size(x, 2)
        x1 = fd.ops.slice(x, [0, 0, 0, 0], [b, heads, seq, dim // 2])
        x2 = fd.ops.slice(x, [0, 0, 0, dim // 2], [b, heads, seq, dim])
        out = fd.ops.cat([fd.ops.neg(x2), x1], -1)
        fd.add_output(out)
        _shard(x, mesh, 1)
    for t in (3, 4):
        full = torch.randn(b, heads, t, dim)
        (res,), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
        assert comms == []
        ref = torch.cat([-full[..., dim // 2:], full[..., :dim // 2]], -1)
        torch.testing.assert_close(res.cpu(), mesh.shard_tensor(ref, 1, rank))


def test_pad_along_a_symbolic_sharded_axis_gathers_first(multidevice_test):
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3])
        out = fd.ops.pad(x, [0, 0, 1, 2], -1.0)  # axis 0, the sharded one: 1 before, 2 after
        fd.add_output(out)
        _shard(x, mesh, 0)
    full = torch.randn(2 * d, 3)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 0, rank).to(dev)])
    assert comms == _expect(d, _allgather(d, 2 * 3 * F32))
    torch.testing.assert_close(res.cpu(), torch.nn.functional.pad(full, [0, 0, 1, 2], value=-1.0))


def test_pad_that_shifts_the_sharded_axis_gathers_first(multidevice_test):
    # Widths [1, -1] keep the extent but shift the data: not a pass-through axis.
    d, rank, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 2 * d])
        out = fd.ops.pad(x, [1, -1])
        fd.add_output(out)
        _shard(x, mesh, 1)
        _shard(out, mesh, 1)
    full = torch.randn(3, 2 * d)
    (res,), comms = _plan(fd, [mesh.shard_tensor(full, 1, rank).to(dev)])
    assert comms == _expect(d, _allgather(d, 3 * 2 * F32), ("LocalSlice", 0, 0))
    torch.testing.assert_close(res.cpu(), mesh.shard_tensor(torch.nn.functional.pad(full, [1, -1]), 1, rank))
