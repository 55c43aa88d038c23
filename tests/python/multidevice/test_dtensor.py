"""DTensor interop: meshfuser.dtensor.compile derives the schedule from the inputs' placements, and
fd.execute accepts DTensors for an already scheduled definition. Results are compared with DTensor's own
eager computation on the same inputs."""
import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import meshfuser
from meshfuser.testing import communication_kinds
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

RTOL, ATOL = 1e-5, 1e-4


def _torch_mesh(mt, shape=None, names=("tp",)):
    return init_device_mesh(mt.device.type, shape or (mt.size,), mesh_dim_names=names)


def _dist(t, mesh, placements, mt):
    return distribute_tensor(t.to(mt.device), mesh, placements)


def _communications(fn):
    with meshfuser.Profiler() as prof:
        fn()
    return [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def _linear(fd):
    x = fd.define_tensor([-1, -1])
    w = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.linear(x, w))


def _linear_bias(fd):
    x = fd.define_tensor([-1, -1])
    w = fd.define_tensor([-1, -1])
    b = fd.define_tensor([-1])
    fd.add_output(fd.ops.linear(x, w, b))


def _mlp(fd):
    x = fd.define_tensor([-1, -1])
    w1 = fd.define_tensor([-1, -1])
    b1 = fd.define_tensor([-1])
    w2 = fd.define_tensor([-1, -1])
    h = fd.ops.gelu(fd.ops.linear(x, w1, b1))
    fd.add_output(fd.ops.linear(h, w2))


def _assert_placements_match_shardings(out, fd):
    """The DTensor's placements are exactly what meshfuser reports for the output."""
    sharding = fd.get_output_shardings()[0]
    k = out.device_mesh.ndim
    pts = [ParallelType.mesh_z, ParallelType.mesh_y, ParallelType.mesh_x][3 - k:]
    want = [Shard(sharding.axis_sharded_on(pt)) if sharding.axis_sharded_on(pt) >= 0 else Replicate() for pt in pts]
    assert list(out.placements) == want, (out.placements, sharding)


def test_column_parallel_linear(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    x = _dist(torch.randn(8, 16), mesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8, 16), mesh, [Shard(0)], multidevice_test)
    b = _dist(torch.randn(d * 8), mesh, [Shard(0)], multidevice_test)
    f = meshfuser.dtensor.compile(_linear_bias)
    out = f(x, w, b)
    assert isinstance(out, DTensor)
    assert out.shape == (8, d * 8)
    assert out.placements == (Shard(1),)  # column parallel: no communication, output sharded on n
    assert out.to_local().shape == (8, 8)
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w, b).full_tensor(), rtol=RTOL, atol=ATOL)
    _assert_placements_match_shardings(out, f.definitions()[0])
    assert _communications(lambda: f(x, w, b)) == []


def test_row_parallel_linear(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    x = _dist(torch.randn(8, d * 8), mesh, [Shard(1)], multidevice_test)
    w = _dist(torch.randn(16, d * 8), mesh, [Shard(1)], multidevice_test)
    f = meshfuser.dtensor.compile(_linear)
    out = f(x, w)
    assert out.shape == (8, 16)
    assert out.placements == (Replicate(),)  # reduced over the sharded k: Allreduce
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out.to_local(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
    _assert_placements_match_shardings(out, f.definitions()[0])
    comms = _communications(lambda: f(x, w))
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def test_mlp(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    x = _dist(torch.randn(8, 16), mesh, [Replicate()], multidevice_test)
    w1 = _dist(torch.randn(d * 8, 16), mesh, [Shard(0)], multidevice_test)
    b1 = _dist(torch.randn(d * 8), mesh, [Shard(0)], multidevice_test)
    w2 = _dist(torch.randn(16, d * 8), mesh, [Shard(1)], multidevice_test)
    f = meshfuser.dtensor.compile(_mlp)
    out = f(x, w1, b1, w2)
    assert out.shape == (8, 16)
    assert out.placements == (Replicate(),)
    expected = F.linear(F.gelu(F.linear(x, w1, b1)), w2).full_tensor()
    torch.testing.assert_close(out.full_tensor(), expected, rtol=RTOL, atol=ATOL)
    _assert_placements_match_shardings(out, f.definitions()[0])
    comms = _communications(lambda: f(x, w1, b1, w2))
    assert communication_kinds(comms) == (["Allreduce"] if d > 1 else []), comms


def test_2d_mesh_dp_tp(multidevice_test):
    if multidevice_test.size != 4:
        pytest.skip("needs 4 ranks")
    mesh = _torch_mesh(multidevice_test, (2, 2), ("dp", "tp"))
    x = _dist(torch.randn(8, 16), mesh, [Shard(0), Replicate()], multidevice_test)
    w = _dist(torch.randn(2 * 8, 16), mesh, [Replicate(), Shard(0)], multidevice_test)
    f = meshfuser.dtensor.compile(_linear)
    out = f(x, w)
    assert out.shape == (8, 16)
    assert out.placements == (Shard(0), Shard(1))
    assert out.to_local().shape == (4, 8)
    assert out.device_mesh is mesh and out.device_mesh.mesh_dim_names == ("dp", "tp")
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
    _assert_placements_match_shardings(out, f.definitions()[0])
    assert _communications(lambda: f(x, w)) == []


def test_2d_mesh_row_parallel_within_tp(multidevice_test):
    if multidevice_test.size != 4:
        pytest.skip("needs 4 ranks")
    mesh = _torch_mesh(multidevice_test, (2, 2), ("dp", "tp"))
    x = _dist(torch.randn(8, 16), mesh, [Shard(0), Shard(1)], multidevice_test)
    w = _dist(torch.randn(12, 16), mesh, [Replicate(), Shard(1)], multidevice_test)
    f = meshfuser.dtensor.compile(_linear)
    out = f(x, w)
    assert out.shape == (8, 12)
    assert out.placements == (Shard(0), Replicate())  # Allreduce within each tp row
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
    _assert_placements_match_shardings(out, f.definitions()[0])


def test_cache_per_placements(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    ux, uw = torch.randn(8, d * 8), torch.randn(d * 8, d * 8)
    col = (_dist(ux, mesh, [Replicate()], multidevice_test), _dist(uw, mesh, [Shard(0)], multidevice_test))
    row = (_dist(ux, mesh, [Shard(1)], multidevice_test), _dist(uw, mesh, [Shard(1)], multidevice_test))
    expected = F.linear(ux, uw)
    f = meshfuser.dtensor.compile(_linear)
    torch.testing.assert_close(f(*col).full_tensor().cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(f(*col).full_tensor().cpu(), expected, rtol=RTOL, atol=ATOL)
    assert f.num_compiled() == 1
    torch.testing.assert_close(f(*row).full_tensor().cpu(), expected, rtol=RTOL, atol=ATOL)
    assert f.num_compiled() == 2
    torch.testing.assert_close(f(*col).full_tensor().cpu(), expected, rtol=RTOL, atol=ATOL)
    assert f.num_compiled() == 2
    # a different global shape is a different definition too
    f(_dist(torch.randn(4, d * 8), mesh, [Replicate()], multidevice_test), col[1])
    assert f.num_compiled() == 3


def test_mesh_dim_names_preserved(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test, names=("model",))
    x = _dist(torch.randn(8, 16), mesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8, 16), mesh, [Shard(0)], multidevice_test)
    out = meshfuser.dtensor.compile(_linear)(x, w)
    assert out.device_mesh is mesh
    assert out.device_mesh.mesh_dim_names == ("model",)
    assert out.device_mesh["model"].size() == d


def test_partial_input_is_reduced_first(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = _torch_mesh(multidevice_test)
    ux = torch.randn(8, 16)
    # every rank holds ux * (rank + 1) / s: the sum over ranks is ux
    s = d * (d + 1) / 2
    x = DTensor.from_local((ux * (rank + 1) / s).to(multidevice_test.device), mesh, [Partial()])
    w = _dist(torch.randn(d * 8, 16), mesh, [Shard(0)], multidevice_test)
    out = meshfuser.dtensor.compile(_linear)(x, w)
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out.full_tensor().cpu(), F.linear(ux, w.full_tensor().cpu()), rtol=RTOL, atol=ATOL)


def test_multiple_outputs(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)

    def define(fd):
        x = fd.define_tensor([-1, -1])
        y = fd.ops.relu(x)
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, [1]))

    x = _dist(torch.randn(d * 4, 6), mesh, [Shard(0)], multidevice_test)
    y, s = meshfuser.dtensor.compile(define)(x)
    assert y.placements == (Shard(0),) and y.shape == (d * 4, 6)
    assert s.placements == (Shard(0),) and s.shape == (d * 4,)
    torch.testing.assert_close(y.full_tensor(), torch.relu(x).full_tensor())
    torch.testing.assert_close(s.full_tensor(), torch.relu(x).sum(1).full_tensor(), rtol=RTOL, atol=ATOL)


# -- fd.execute with DTensors on an already scheduled definition ---------------------------------------

def _scheduled_column_parallel(d, mesh):
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        w = fd.define_tensor([d * 8, 16])
        out = fd.ops.linear(x, w)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        for tv, axis in ((w, 0), (out, 1)):
            tv.set_device_mesh(mesh)
            tv.split(axis, d, False)
            tv.axis(axis).parallelize(ParallelType.mesh_x)
    return fd


def test_execute_scheduled_with_dtensors(multidevice_test):
    d = multidevice_test.size
    tmesh = _torch_mesh(multidevice_test)
    fd = _scheduled_column_parallel(d, DeviceMesh(range(d)))
    x = _dist(torch.randn(8, 16), tmesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8, 16), tmesh, [Shard(0)], multidevice_test)
    (out,) = fd.execute([x, w])
    assert isinstance(out, DTensor) and out.placements == (Shard(1),) and out.shape == (8, d * 8)
    assert out.device_mesh.mesh_dim_names == ("tp",)
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)


def test_execute_class_style_with_dtensors(multidevice_test):
    d = multidevice_test.size
    tmesh = _torch_mesh(multidevice_test)
    mesh = DeviceMesh(range(d))

    class Model(FusionDefinition):
        def definition(self):
            self.x = self.define_tensor([8, d * 8])
            self.w = self.define_tensor([16, d * 8])
            self.out = self.ops.linear(self.x, self.w)
            self.add_output(self.out)

        def multidevice_schedule(self):
            for t in [self.x, self.w, self.out]:
                self.sched._set_device_mesh(t, mesh)
                self.sched.split(t, -1, d, False)
                self.sched.parallelize(t, -2, ParallelType.mesh_x)

    x = _dist(torch.randn(8, d * 8), tmesh, [Shard(1)], multidevice_test)
    w = _dist(torch.randn(16, d * 8), tmesh, [Shard(1)], multidevice_test)
    (out,), shardings = Model().execute([x, w])
    assert shardings[0].axis_sharded_on(ParallelType.mesh_x) == -1
    assert out.placements == (Replicate(),) and out.shape == (8, 16)
    torch.testing.assert_close(out.full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)


# -- errors ------------------------------------------------------------------------------------------

def test_error_placement_mismatch(multidevice_test):
    d = multidevice_test.size
    tmesh = _torch_mesh(multidevice_test)
    fd = _scheduled_column_parallel(d, DeviceMesh(range(d)))
    x = _dist(torch.randn(8, 16), tmesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8, 16 * d), tmesh, [Shard(1)], multidevice_test)
    with pytest.raises(meshfuser.Error, match=r"input 1.*expects \[Shard\(0\)\].*has \[Shard\(1\)\]"):
        fd.execute([x, w])


def test_error_uneven_shard(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    x = _dist(torch.randn(8, 16), mesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8 + 1, 16), mesh, [Shard(0)], multidevice_test)
    f = meshfuser.dtensor.compile(_linear)
    if d == 1:  # every extent divides a mesh of one: nothing is uneven
        torch.testing.assert_close(f(x, w).full_tensor(), F.linear(x, w).full_tensor(), rtol=RTOL, atol=ATOL)
        return
    with pytest.raises(meshfuser.Error, match=rf"input 1: uneven shard: tensor axis 0 has extent {d * 8 + 1}, "
                                              rf"not divisible by mesh size {d}"):
        f(x, w)
    assert f.num_compiled() == 0


def test_error_plain_tensor_mixed_with_dtensors(multidevice_test):
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    x = _dist(torch.randn(8, 16), mesh, [Replicate()], multidevice_test)
    w_local = torch.randn(8, 16).to(multidevice_test.device)
    w = _dist(torch.randn(d * 8, 16), mesh, [Shard(0)], multidevice_test)
    with pytest.raises(meshfuser.Error, match=r"input 1 is a plain torch.Tensor"):
        meshfuser.dtensor.compile(_linear)(x, w_local)
    fd = _scheduled_column_parallel(d, DeviceMesh(range(d)))
    with pytest.raises(meshfuser.Error, match=r"input 0 is a plain torch.Tensor"):
        fd.execute([x.to_local(), w])


def test_error_nested_shard(multidevice_test):
    """Shard(0) on both mesh dims needs a split of a split to be sharded, which meshfuser refuses in
    this version ("only one outer split of a logical axis can be sharded"): refused up front."""
    if multidevice_test.size != 4:
        pytest.skip("needs 4 ranks")
    mesh = _torch_mesh(multidevice_test, (2, 2), ("dp", "tp"))

    def define(fd):
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.relu(x))

    x = _dist(torch.randn(16, 6), mesh, [Shard(0), Shard(0)], multidevice_test)
    with pytest.raises(meshfuser.Error, match=r"input 0: tensor axis 0 is sharded on mesh dims \[0, 1\]"):
        meshfuser.dtensor.compile(define)(x)


def test_error_mesh_mismatch(multidevice_test):
    d = multidevice_test.size
    tmesh = _torch_mesh(multidevice_test)
    fd = _scheduled_column_parallel(d, DeviceMesh(list(reversed(range(d))) + [d]))  # one rank too many
    x = _dist(torch.randn(8, 16), tmesh, [Replicate()], multidevice_test)
    w = _dist(torch.randn(d * 8, 16), tmesh, [Shard(0)], multidevice_test)
    with pytest.raises(meshfuser.Error, match=r"input 0: the fusion input T\d+ is on the mesh of ranks"):
        fd.execute([x, w])


def test_execute_scheduled_with_partial_input(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    tmesh = _torch_mesh(multidevice_test)
    fd = _scheduled_column_parallel(d, DeviceMesh(range(d)))
    ux = torch.randn(8, 16)
    x = DTensor.from_local((ux / d).to(multidevice_test.device), tmesh, [Partial()])  # sums to ux
    w = _dist(torch.randn(d * 8, 16), tmesh, [Shard(0)], multidevice_test)
    (out,) = fd.execute([x, w])
    torch.testing.assert_close(out.full_tensor().cpu(), F.linear(ux, w.full_tensor().cpu()), rtol=RTOL, atol=ATOL)


# -- the weight gradient of a sharded linear (3-D activations, symbolic extents) --------------------

def _linear_3d(fd):
    x = fd.define_tensor([-1, -1, -1])
    w = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.linear(x, w))


def _linear_3d_backward(fd):
    """grad_out, x, w -> grad_x = grad_out @ w, grad_w = grad_out_rows^T @ x_rows (rows = b*s)."""
    g = fd.define_tensor([-1, -1, -1])
    x = fd.define_tensor([-1, -1, -1])
    w = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.matmul(g, w))
    g_rows = fd.ops.reshape(g, [-1, fd.ops.size(g, 2)])
    x_rows = fd.ops.reshape(x, [-1, fd.ops.size(x, 2)])
    fd.add_output(fd.ops.matmul(fd.ops.permute(g_rows, [1, 0]), x_rows))


@pytest.mark.parametrize("parallel", ["column", "row"])
def test_linear_weight_gradient_is_sharded_like_the_weight(multidevice_test, parallel):
    # Column parallel: w Shard(0), x Replicate, grad_out Shard(2); row parallel: w Shard(1), x Shard(2),
    # grad_out Replicate. grad_w comes out of the backward definition sharded like w, at 1/d of its
    # size, with no Allgather (it used to gather the sharded operand and return a Replicate grad_w).
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test)
    b, s, n, k = 2, 3, 4 * d, 2 * d
    col = parallel == "column"
    ug, ux, uw = torch.randn(b, s, n), torch.randn(b, s, k), torch.randn(n, k)
    g = _dist(ug, mesh, [Shard(2) if col else Replicate()], multidevice_test)
    x = _dist(ux, mesh, [Replicate() if col else Shard(2)], multidevice_test)
    w = _dist(uw, mesh, [Shard(0) if col else Shard(1)], multidevice_test)
    backward = meshfuser.dtensor.compile(_linear_3d_backward)
    grad_x, grad_w = backward(g, x, w)
    assert grad_w.placements == w.placements, grad_w.placements
    assert grad_w.to_local().shape == w.to_local().shape
    torch.testing.assert_close(grad_w.full_tensor().cpu(), ug.reshape(-1, n).T @ ux.reshape(-1, k), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grad_x.full_tensor().cpu(), ug @ uw, rtol=RTOL, atol=ATOL)
    comms = communication_kinds(_communications(lambda: backward(g, x, w)))
    # Column parallel sums grad_x over the sharded n (an Allreduce); row parallel moves nothing.
    assert comms == (["Allreduce"] if col and d > 1 else []), comms

    # Through torch.autograd: w.grad is sharded like w, and the backward still gathers nothing.
    trainable = meshfuser.dtensor.compile(_linear_3d, backward=_linear_3d_backward)
    w_param = _dist(uw, mesh, [Shard(0) if col else Shard(1)], multidevice_test).requires_grad_()
    out = trainable(x, w_param)
    comms = communication_kinds(_communications(lambda: out.backward(g)))
    assert "Allgather" not in comms, comms
    assert w_param.grad.placements == w_param.placements
    torch.testing.assert_close(w_param.grad.full_tensor().cpu(), ug.reshape(-1, n).T @ ux.reshape(-1, k),
                               rtol=RTOL, atol=ATOL)
