"""Issue 32: nothing silent. Each call knows which call it is (definition and call number, thread),
meshes are checked against the world, failures before the agreement reach it, extents that
overflow and bad embedding indices are errors on every rank. Faults that need a rank to exit or to
skip its last call run as separate jobs (tests/faults)."""
import re
import threading

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _gather_program(mesh, rows, cols=3):
    """[rows, cols] sharded on axis 0 -> replicated (an Allgather). cols tells definitions apart."""
    with FusionDefinition() as fd:
        inp = fd.define_tensor([rows, cols])
        fd.add_output(fd.ops.set(inp))
        _shard(inp, mesh, 0)
        fd.fusion.output(0).set_device_mesh(mesh)
    return fd


def _needs(d, n=2):
    if d < n:
        pytest.skip(f"needs {n}+ ranks")


# -- 1. Call numbers -------------------------------------------------------------------------------
def test_skipped_call_then_another_definition_names_the_call_numbers(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    mesh = DeviceMesh(range(d))
    a, b = _gather_program(mesh, 4 * d, cols=5), _gather_program(mesh, 4 * d, cols=6)
    full_a, full_b = torch.randn(4 * d, 5), torch.randn(4 * d, 6)
    xa = multidevice_test.shard_tensor(full_a, 0, mesh)
    xb = multidevice_test.shard_tensor(full_b, 0, mesh)
    a.execute([xa])
    late = rank == d - 1
    with pytest.raises(meshfuser.Error) as e:  # the late rank skipped call 2 of `a`
        b.execute([xb]) if late else a.execute([xa])
    msg = str(e.value)
    assert "out of step" in msg and "compiled a different program" in msg, msg
    # (numbers count every call of the definition in this process, earlier tests' too)
    assert re.search(rf"rank {d - 1}: call \d+ of definition [0-9a-f]+", msg), msg
    assert re.search(r"rank 0: call \d+ of definition [0-9a-f]+", msg), msg
    # The error re-synchronized the call numbers: the next calls of both definitions work everywhere.
    (out,) = a.execute([xa])
    torch.testing.assert_close(out.cpu(), full_a)
    (out,) = b.execute([xb])
    torch.testing.assert_close(out.cpu(), full_b)


def test_call_numbers_in_a_program_without_communication(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    mesh = DeviceMesh([0])
    defs = []
    for k in range(2):
        with FusionDefinition() as fd:
            x = fd.define_tensor([4, 3 + k])
            fd.add_output(fd.ops.relu(x))
            x.set_device_mesh(mesh)
        defs.append(fd)
    t = [torch.randn(4, 3 + k, device=multidevice_test.device) for k in range(2)]
    defs[0].execute([t[0]])
    with pytest.raises(meshfuser.Error, match=rf"rank 0: call \d+ of definition [0-9a-f]+.*rank {d - 1}: call \d+ of "
                                              r"definition [0-9a-f]+"):
        defs[1].execute([t[1]]) if rank == d - 1 else defs[0].execute([t[0]])
    (out,) = defs[0].execute([t[0]])
    if rank == 0:
        torch.testing.assert_close(out, t[0].relu())


# -- 2. Meshes against the world -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["too_many_devices", "rank_outside"])
def test_mesh_larger_than_the_world_is_an_error_on_every_rank(multidevice_test, kind):
    d = multidevice_test.size
    devices = list(range(d + 1)) if kind == "too_many_devices" else [0, d]
    mesh = DeviceMesh(devices)
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * len(devices), 3])
        fd.add_output(fd.ops.relu(x))
        _shard(x, mesh, 0)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([torch.randn(4, 3, device=multidevice_test.device)])
    msg = str(e.value)
    assert f"mesh {mesh}" in msg or "mesh [" in msg, msg
    assert f"{d} process" in msg, msg
    assert f"torchrun --nproc_per_node={max(len(devices), d + 1)}" in msg, msg


# -- 4. Failures before the agreement ---------------------------------------------------------------
@pytest.mark.parametrize("fault", ["int_past_int64", "none_inputs", "not_iterable"])
def test_python_failure_before_the_agreement_reaches_every_rank(multidevice_test, fault):
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 3])
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(fd.ops.set(x), s))
        _shard(x, mesh, 0)
        fd.fusion.output(0).set_device_mesh(mesh)
    full = torch.randn(4 * d, 3)
    good = [multidevice_test.shard_tensor(full, 0, mesh), 2]
    bad = {"int_past_int64": [good[0], 2 ** 70], "none_inputs": None, "not_iterable": 5}[fault]
    with pytest.raises(Exception) as e:
        fd.execute(bad if rank == d - 1 else good)
    msg = str(e.value)
    if rank == d - 1:
        if fault == "int_past_int64":
            assert isinstance(e.value, meshfuser.Error) and "outside the int64 range" in msg, msg
    else:
        assert isinstance(e.value, meshfuser.Error), repr(e.value)
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute(good)  # in step: the next call is right
    torch.testing.assert_close(out.cpu(), full * 2)


def test_extent_overflow_is_an_error_on_every_rank(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    mesh = DeviceMesh(range(d))
    fd = _gather_program(mesh, -1, cols=1)
    full = torch.randn(4 * d, 1)
    good = multidevice_test.shard_tensor(full, 0, mesh)
    # local x shards overflows int64; on 4 ranks (2^62 + 4) x 4 wraps to 16, the others' 4 x 4
    huge = torch.empty(1, 1, device=multidevice_test.device).expand(2 ** 62 + 4, 1)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([huge if rank == d - 1 else good])
    msg = str(e.value)
    if rank == d - 1:
        assert "overflows a 64-bit global extent" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute([good])
    torch.testing.assert_close(out.cpu(), full)


def _embedding(mesh, vocab, dim, shard_weight, shard_indices):
    with FusionDefinition() as fd:
        idx = fd.define_tensor([2 * mesh.size, 3], dtype=DataType.Int)
        w = fd.define_tensor([vocab, dim])
        out = fd.ops.embedding_fwd(idx, w)
        fd.add_output(out)
        for tv in (idx, w, out):
            tv.set_device_mesh(mesh)
        if shard_weight:
            _shard(w, mesh, 0)
        if shard_indices:
            _shard(idx, mesh, 0)
            _shard(out, mesh, 0)
    return fd


@pytest.mark.parametrize("layout", ["vocab_parallel_replicated_indices", "replicated_table_sharded_indices"])
def test_embedding_index_error_on_one_rank_reaches_every_rank(multidevice_test, layout):
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    mesh = DeviceMesh(range(d))
    vocab, dim = 64 * d, 4
    vocab_parallel = layout.startswith("vocab")
    fd = _embedding(mesh, vocab, dim, shard_weight=vocab_parallel, shard_indices=not vocab_parallel)
    full_w = torch.randn(vocab, dim)
    full_idx = torch.randint(0, vocab, (2 * d, 3))
    w = multidevice_test.shard_tensor(full_w, 0, mesh) if vocab_parallel else full_w
    idx = full_idx if vocab_parallel else full_idx.chunk(d)[rank]
    w, idx = w.to(multidevice_test.device), idx.to(multidevice_test.device)
    bad = idx.clone()
    bad.view(-1)[0] = vocab
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([bad if rank == d - 1 else idx, w])
    msg = str(e.value)
    if rank == d - 1:
        assert f"must lie in [0, {vocab})" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg, msg
    (out,) = fd.execute([idx, w])
    expected = F.embedding(full_idx, full_w)
    torch.testing.assert_close(out.cpu(), expected if vocab_parallel else expected.chunk(d)[rank])


# -- 4. Threads --------------------------------------------------------------------------------------
@pytest.mark.parametrize("same_definition", [True, False])
def test_two_threads_never_get_each_others_data(multidevice_test, same_definition):
    """Two threads per rank call execute; the ranks may take the threads' calls in different orders.
    Every call returns its own thread's data or raises meshfuser.Error, never the other thread's."""
    d = multidevice_test.size
    _needs(d)
    mesh = DeviceMesh(range(d))
    shared = _gather_program(mesh, 4 * d, cols=10)
    programs = [shared, shared] if same_definition else [shared, _gather_program(mesh, 4 * d, cols=10)]
    fulls = [torch.full((4 * d, 10), float(k + 1)) for k in range(2)]
    wrong, errors, others = [], [], []

    def work(k):
        x = multidevice_test.shard_tensor(fulls[k], 0, mesh)
        for _ in range(12):
            try:
                (out,) = programs[k].execute([x])
                if not torch.equal(out.cpu(), fulls[k]):
                    wrong.append(k)
            except meshfuser.Error as e:
                errors.append(str(e))
            except Exception as e:  # noqa: BLE001
                others.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,), name=f"worker-{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not others, others
    assert not wrong, f"{len(wrong)} calls returned another thread's data"
    for msg in errors:
        assert "different threads" in msg and "worker-" in msg, msg
    # Afterwards the main thread's calls work.
    (out,) = shared.execute([multidevice_test.shard_tensor(fulls[0], 0, mesh)])
    torch.testing.assert_close(out.cpu(), fulls[0])


# -- 4. A failure every rank shares ------------------------------------------------------------------
def test_failure_every_rank_shares_keeps_the_groups_usable(multidevice_test, monkeypatch):
    """Every rank fails where the first communication allocates (as an out-of-memory error would),
    before anything is posted: every rank knows the outcome, and the next call works."""
    d = multidevice_test.size
    _needs(d)
    mesh = DeviceMesh(range(d))
    fd = _gather_program(mesh, 4 * d, cols=11)
    full = torch.randn(4 * d, 11)
    x = multidevice_test.shard_tensor(full, 0, mesh)
    fd.execute([x])
    monkeypatch.setenv("MESHFUSER_INJECT_FAULT", "before_post:all")
    with pytest.raises(meshfuser.Error, match="fault injected on rank .* before this rank posted any data"):
        fd.execute([x])
    monkeypatch.delenv("MESHFUSER_INJECT_FAULT")
    assert not meshfuser.Communicator.instance().broken()
    (out,) = fd.execute([x])
    torch.testing.assert_close(out.cpu(), full)


def test_control_transport_is_shared_memory_by_default(multidevice_test):
    import os
    d = multidevice_test.size
    _needs(d)
    expected = os.environ.get("MESHFUSER_CONTROL_TRANSPORT", "auto").lower()
    assert meshfuser.Communicator.instance().control_transport() == ("gloo" if expected == "gloo" else "shm")


def test_dtensor_placement_error_on_one_rank_reaches_every_rank(multidevice_test):
    """The placement check runs in Python, before the program: the failing rank's error still goes
    into the call's agreement, so the others raise instead of waiting for it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    d, rank = multidevice_test.size, multidevice_test.rank
    _needs(d)
    tmesh = init_device_mesh(multidevice_test.device.type, (d,))
    mesh = DeviceMesh(range(d))
    fd = _gather_program(mesh, 4 * d, cols=12)
    full = torch.randn(4 * d, 12, device=multidevice_test.device)
    sharded = distribute_tensor(full, tmesh, [Shard(0)])
    replicated = distribute_tensor(full, tmesh, [Replicate()])
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([replicated if rank == d - 1 else sharded])
    msg = str(e.value)
    if rank == d - 1:
        assert "placement mismatch" in msg, msg
    else:
        assert f"validation failed on rank(s) {d - 1}" in msg and "placement mismatch" not in msg, msg
    (out,) = fd.execute([sharded])
    torch.testing.assert_close(out.full_tensor().cpu(), full.cpu())


def test_embedding_index_error_on_one_mesh_row_reaches_every_rank(multidevice_test):
    """2 x 2 mesh: indices split over mesh_y (each row of the mesh holds its half), the table's
    vocabulary over mesh_x. A bad index in row 1's half: rows 0 and 1 raise together."""
    d, rank = multidevice_test.size, multidevice_test.rank
    if d != 4:
        pytest.skip("needs 4 ranks")
    mesh = DeviceMesh(torch.arange(4).view(2, 2))
    vocab, dim = 128, 4
    with FusionDefinition() as fd:
        idx = fd.define_tensor([4, 3], dtype=DataType.Int)
        w = fd.define_tensor([vocab, dim])
        out = fd.ops.embedding_fwd(idx, w)
        fd.add_output(out)
        for tv in (idx, w, out):
            tv.set_device_mesh(mesh)
        for tv in (idx, out):
            tv.split(0, 2, False)
            tv.axis(0).parallelize(ParallelType.mesh_y)
        w.split(0, 2, False)
        w.axis(0).parallelize(ParallelType.mesh_x)
    full_idx = torch.randint(0, vocab, (4, 3))
    full_w = torch.randn(vocab, dim)
    row, col = rank // 2, rank % 2
    idx_local = full_idx.chunk(2)[row].to(multidevice_test.device)
    w_local = full_w.chunk(2)[col].to(multidevice_test.device)
    bad = idx_local.clone()
    bad[0, 0] = vocab
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([bad if row == 1 else idx_local, w_local])
    msg = str(e.value)
    if row == 1:
        assert f"indices must lie in [0, {vocab})" in msg, msg
    else:
        assert "validation failed on rank(s) 2, 3" in msg, msg
    (o,) = fd.execute([idx_local, w_local])
    torch.testing.assert_close(o.cpu(), torch.nn.functional.embedding(full_idx, full_w).chunk(2)[row])
