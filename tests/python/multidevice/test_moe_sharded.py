"""Mixture-of-experts ops on several ranks: column-parallel experts (grouped_mm with mat2 split on
its columns) and the routing ops with rows split stay local; an axis the op reads across (the
sorted axis, grouped_mm's token rows) is gathered first. Checked against PyTorch on the unsharded
tensors."""
import torch

import meshfuser
from meshfuser.testing import communication_kinds
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return communication_kinds([k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"])


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.split(axis, mesh.size, False)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _offsets(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def _grouped(mat1, mat2, offs):
    out, start = torch.zeros(mat1.shape[0], mat2.shape[2]), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = mat1[start:end] @ mat2[g]
        start = end
    return out


def test_column_parallel_grouped_mm(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    offs = _offsets([3, 0, 4])  # an expert without tokens
    with FusionDefinition() as fd:
        tokens = fd.define_tensor([7, 8])
        w = fd.define_tensor([3, 8, d * 4])
        o = fd.define_tensor([3], dtype=DataType.Int32)
        out = fd.ops.grouped_mm(tokens, w, o)
        fd.add_output(out)
        tokens.set_device_mesh(mesh)
        o.set_device_mesh(mesh)
        _shard(w, mesh, 2)
        _shard(out, mesh, 1)
    ut, uw = torch.randn(7, 8), torch.randn(3, 8, d * 4)
    dev = multidevice_test.device
    inputs = [ut.to(dev), multidevice_test.shard_tensor(uw, 2, mesh), offs.to(dev)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), mesh.shard_tensor(_grouped(ut, uw, offs), 1, multidevice_test.rank))
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1
    assert _communications(fd, inputs) == []


def test_grouped_mm_token_rows_are_gathered(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    offs = _offsets([d, 2 * d, d])
    with FusionDefinition() as fd:
        tokens = fd.define_tensor([4 * d, 8])
        w = fd.define_tensor([3, 8, 5])
        o = fd.define_tensor([3], dtype=DataType.Int32)
        fd.add_output(fd.ops.grouped_mm(tokens, w, o))
        _shard(tokens, mesh, 0)
        w.set_device_mesh(mesh)
        o.set_device_mesh(mesh)
    ut, uw = torch.randn(4 * d, 8), torch.randn(3, 8, 5)
    dev = multidevice_test.device
    inputs = [multidevice_test.shard_tensor(ut, 0, mesh), uw.to(dev), offs.to(dev)]
    (out_t,) = fd.execute(inputs)
    torch.testing.assert_close(out_t.cpu(), _grouped(ut, uw, offs))
    assert _communications(fd, inputs) == (["Allgather"] if d > 1 else [])


def test_routing_rows_split_stay_local(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        probs = fd.define_tensor([2 * d, 6])
        weights, experts = fd.ops.topk(probs, 2, dim=1)
        order = fd.ops.argsort(experts, dim=1, stable=True)
        ends = fd.ops.cumsum(experts, 1)
        for t in (weights, order, ends):
            fd.add_output(t)
        for t in (probs, weights, experts, order, ends):
            _shard(t, mesh, 0)
    up = torch.rand(2 * d, 6)
    inputs = [multidevice_test.shard_tensor(up, 0, mesh)]
    out_w, out_o, out_e = fd.execute(inputs)
    ref_w, ref_e = torch.topk(up, 2, dim=1)
    rank = multidevice_test.rank
    torch.testing.assert_close(out_w.cpu(), mesh.shard_tensor(ref_w, 0, rank))
    torch.testing.assert_close(out_o.cpu(), mesh.shard_tensor(torch.argsort(ref_e, dim=1, stable=True), 0, rank))
    torch.testing.assert_close(out_e.cpu(), mesh.shard_tensor(torch.cumsum(ref_e, 1), 0, rank))
    assert _communications(fd, inputs) == []


def test_sorted_axis_split_is_gathered(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 4 * d])
        fd.add_output(fd.ops.argsort(x, dim=1, stable=True))
        _shard(x, mesh, 1)
    ux = torch.randn(3, 4 * d)
    inputs = [multidevice_test.shard_tensor(ux, 1, mesh)]
    (out,) = fd.execute(inputs)
    torch.testing.assert_close(out.cpu(), torch.argsort(ux, dim=1, stable=True))
    assert _communications(fd, inputs) == (["Allgather"] if d > 1 else [])


def test_row_parallel_grouped_mm(multidevice_test):
    """k split on both operands: each device multiplies its slice of k, one Allreduce sums them (a
    ReduceScatter when the output is scattered on its rows)."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    offs = _offsets([2 * d, 0, d, d])  # an expert without tokens
    for scatter in (False, True):
        with FusionDefinition() as fd:
            tokens = fd.define_tensor([4 * d, 4 * d])
            w = fd.define_tensor([4, 4 * d, 6])
            o = fd.define_tensor([4], dtype=DataType.Int32)
            out = fd.ops.grouped_mm(tokens, w, o)
            fd.add_output(out)
            _shard(tokens, mesh, 1)
            _shard(w, mesh, 1)
            o.set_device_mesh(mesh)
            if scatter:
                _shard(out, mesh, 0)
            else:
                out.set_device_mesh(mesh)
        ut, uw = torch.randn(4 * d, 4 * d), torch.randn(4, 4 * d, 6)
        inputs = [multidevice_test.shard_tensor(ut, 1, mesh), multidevice_test.shard_tensor(uw, 1, mesh),
                  offs.to(multidevice_test.device)]
        (out_t,) = fd.execute(inputs)
        ref = _grouped(ut, uw, offs)
        expected = mesh.shard_tensor(ref, 0, multidevice_test.rank) if scatter else ref
        torch.testing.assert_close(out_t.cpu(), expected, rtol=1e-4, atol=1e-4)
        kind = "ReduceScatter" if scatter else "Allreduce"
        assert _communications(fd, inputs) == ([kind] if d > 1 else [])


def test_grouped_swiglu_mlp_tensor_parallel(multidevice_test):
    """The grouped SwiGLU MLP with every expert's ffn features split (column-parallel gate/up,
    row-parallel down): local grouped GEMMs and one Allreduce."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    offs = _offsets([3, 0, 5])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 8])
        w_gate, w_up = fd.define_tensor([3, 8, 2 * d]), fd.define_tensor([3, 8, 2 * d])
        w_down = fd.define_tensor([3, 2 * d, 8])
        o = fd.define_tensor([3], dtype=DataType.Int32)
        h = fd.ops.mul(fd.ops.silu(fd.ops.grouped_mm(x, w_gate, o)), fd.ops.grouped_mm(x, w_up, o))
        out = fd.ops.grouped_mm(h, w_down, o)
        fd.add_output(out)
        for t in (x, o, out):
            t.set_device_mesh(mesh)
        _shard(w_gate, mesh, 2)
        _shard(w_up, mesh, 2)
        _shard(w_down, mesh, 1)
    ux, ug, uu, ud = torch.randn(8, 8), torch.randn(3, 8, 2 * d), torch.randn(3, 8, 2 * d), torch.randn(3, 2 * d, 8)
    inputs = [ux.to(multidevice_test.device), multidevice_test.shard_tensor(ug, 2, mesh),
              multidevice_test.shard_tensor(uu, 2, mesh),
              multidevice_test.shard_tensor(ud, 1, mesh), offs.to(multidevice_test.device)]
    (out_t,) = fd.execute(inputs)
    ref = _grouped(torch.nn.functional.silu(_grouped(ux, ug, offs)) * _grouped(ux, uu, offs), ud, offs)
    torch.testing.assert_close(out_t.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert _communications(fd, inputs) == (["Allreduce"] if d > 1 else [])
