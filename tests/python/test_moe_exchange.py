"""The expert-parallel exchange on one process: the dispatch and combine of a one-device team (the
rows stay, regrouped by expert), the printed IR and host program, and every user error of
all_to_all_dispatch / all_to_all_combine."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _exchange(fd, x, ids, experts, mesh):
    order = fd.ops.argsort(ids, stable=True)
    counts = fd.ops.bincount(ids, experts)
    received, recv_counts = fd.ops.all_to_all_dispatch(fd.ops.index_select(x, 0, order), counts, mesh)
    return order, counts, received, recv_counts


def test_one_device_team_regroups_and_returns_rows():
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([5, 3], name="tokens")
        ids = fd.define_tensor([5], dtype=DataType.Int, name="expert_ids")
        order, counts, received, recv_counts = _exchange(fd, x, ids, 3, mesh)
        back = fd.ops.all_to_all_combine(fd.ops.neg(received), counts, recv_counts)
        for t in (received, recv_counts, fd.ops.index_add(fd.ops.mul(x, 0.0), 0, order, back)):
            fd.add_output(t)
        for t in (x, ids):
            t.set_device_mesh(mesh)
    tokens, chosen = torch.randn(5, 3), torch.tensor([2, 0, 2, 2, 0])
    received, recv_counts, y = fd.execute([tokens, chosen])
    torch.testing.assert_close(received, tokens[torch.argsort(chosen, stable=True)])
    torch.testing.assert_close(recv_counts, torch.bincount(chosen, minlength=3).view(1, 3))  # expert 1: none
    torch.testing.assert_close(y, -tokens)
    text = str(fd)
    assert "all_to_all_counts(T3, T4, mesh_axis=DIDx)" in text
    assert "all_to_all_dispatch(T4, T3, T5, mesh_axis=DIDx)" in text
    program = fd.host_program()
    assert "AllToAll T5 <- T3 on DIDx team=[0] (expert counts" in program
    assert "receives s0 rows, an extent bound at run time) bytes: sent=0 received=0" in program
    assert "Rows received by T6 on the last call: s0 = 5" in program


def test_fake_run_sizes_the_received_rows_by_the_sent_rows():
    """fd.cuda_kernels on meta tensors (torch.compile's fake run): the received rows are unknown,
    the sent rows stand in, so the shapes after the combine are exact."""
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        ids = fd.define_tensor([8], dtype=DataType.Int)
        order, counts, received, recv_counts = _exchange(fd, x, ids, 4, mesh)
        back = fd.ops.all_to_all_combine(fd.ops.silu(received), counts, recv_counts)
        fd.add_output(fd.ops.index_add(fd.ops.mul(x, 0.0), 0, order, back))
        for t in (x, ids):
            t.set_device_mesh(mesh)
    kernels = fd.cuda_kernels([torch.empty(8, 16, device="meta"), torch.empty(8, dtype=torch.long, device="meta")])
    assert any("expf" in k for k in kernels)  # the silu between the exchanges is a generated kernel


def _define(build):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 2], name="tokens")
        counts = fd.define_tensor([4], dtype=DataType.Int, name="counts")
        build(fd, x, counts)
    return fd


@pytest.mark.parametrize("build, match", [
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, c, 3),
     r"all_to_all_dispatch: 4 experts \(counts T1 \(counts\)\) do not split evenly over the 3 devices of DIDx"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, fd.define_tensor([4]), 2),
     r"all_to_all_dispatch: counts T2 must be int64 or int32; got float"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, fd.define_tensor([2, 2], dtype=DataType.Int), 2),
     r"all_to_all_dispatch: counts T2 must be 1-D \(rows per expert\)"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, fd.define_tensor([-1], dtype=DataType.Int), 2),
     r"all_to_all_dispatch: counts T2 needs a constant number of experts"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, c, 2, ParallelType.stream),
     r"all_to_all_dispatch: mesh_axis must be a mesh axis \(mesh_x, mesh_y, mesh_z\); got Stream"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, c, DeviceMesh([0, 1]), ParallelType.mesh_y),
     r"all_to_all_dispatch: mesh .* has no axis"),
    (lambda fd, x, c: fd.ops.all_to_all_dispatch(x, c),
     r"all_to_all_dispatch: expected the mesh to exchange on"),
    (lambda fd, x, c: fd.ops.all_to_all_combine(x, c, fd.define_tensor([2, 2], dtype=DataType.Int)),
     r"all_to_all_combine: recv_counts T2 must be the counts that all_to_all_dispatch returned for counts T1"),
    (lambda fd, x, c: fd.ops.all_to_all_combine(x, c, fd.ops.all_to_all_dispatch(x, c, 2)[1]),
     r"all_to_all_combine: expert_out T0 \(tokens\) has 4 rows; expected the s0 rows that all_to_all_dispatch "
     r"received"),
])
def test_definition_errors(build, match):
    with pytest.raises(meshfuser.Error, match=match):
        _define(build)


def test_lowering_errors():
    """Errors found when the program is lowered: no mesh, a team of another size, a split operand."""
    def dispatch(team):
        with FusionDefinition() as fd:
            x = fd.define_tensor([4, 2], name="tokens")
            counts = fd.define_tensor([4], dtype=DataType.Int, name="counts")
            received, _ = fd.ops.all_to_all_dispatch(x, counts, team)
            fd.add_output(received)
        return fd, x, counts, received

    fd, x, counts, received = dispatch(1)
    with pytest.raises(meshfuser.Error, match=r"all_to_all_dispatch: T1 \(counts\) needs a device mesh with axis DIDx"):
        fd.execute([torch.randn(4, 2), torch.tensor([1, 1, 2, 0])])
    fd, x, counts, received = dispatch(2)
    for t in (x, counts):
        t.set_device_mesh(DeviceMesh([0]))
    with pytest.raises(meshfuser.Error, match=r"the exchange was defined for 2 devices, but mesh .* has 1 along DIDx"):
        fd.execute([torch.randn(4, 2), torch.tensor([1, 1, 2, 0])])
    fd, x, counts, received = dispatch(1)
    mesh = DeviceMesh([0])
    for t in (x, counts):
        t.set_device_mesh(mesh)
    received.set_device_mesh(mesh)
    received.outer_split(1, 1)
    received.axis(1).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match=r"all_to_all_dispatch: T\d+ is split on DIDx .*never split over devices"):
        fd.execute([torch.randn(4, 2), torch.tensor([1, 1, 2, 0])])


def test_counts_that_miss_rows_are_an_error():
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 2], name="tokens")
        counts = fd.define_tensor([2], dtype=DataType.Int, name="counts")
        fd.add_output(fd.ops.all_to_all_dispatch(x, counts, mesh)[0])
        for t in (x, counts):
            t.set_device_mesh(mesh)
    match = (r"all_to_all_dispatch: the expert counts of rank\(s\) \[0\] do not cover their token rows .*"
             r"rank 0: T1 \(counts\) = \[3, -1\], negative, for 4 rows of T0 \(tokens\)")
    with pytest.raises(meshfuser.Error, match=match):
        fd.execute([torch.randn(4, 2), torch.tensor([3, -1])])
    with pytest.raises(meshfuser.Error, match=r"sum 3, for 4 rows"):
        fd.execute([torch.randn(4, 2), torch.tensor([3, 0])])
