"""Expert parallelism: experts split over the ranks of a mesh axis, tokens moved by the program's
own AllToAll (the counts, then an AllToAllV of the rows with the split sizes they give) and moved
back by the reverse AllToAllV. Every rank builds every rank's tokens and routing from one seed, so
each checks what it receives and what comes back against PyTorch on the unsharded data, and the
bytes each exchange moved against the routing."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition
from meshfuser.testing import execute_with_plan

HIDDEN = 8


def _routing(d, tokens, experts, seed, skew):
    """Every rank's (tokens [tokens, HIDDEN], expert ids [tokens]); `skew` makes the routing uneven:
    experts 1 and 2 get nothing, low experts more."""
    g = torch.Generator().manual_seed(seed)
    xs, ids = [], []
    for _ in range(d):
        xs.append(torch.randn(tokens, HIDDEN, generator=g))
        choice = torch.randint(0, experts, (tokens,), generator=g)
        if skew:
            choice = torch.where(choice % 3 == 0, torch.zeros_like(choice), choice)
            choice = torch.where((choice == 1) | (choice == 2), torch.full_like(choice, experts - 1), choice)
        ids.append(choice)
    return xs, ids


def _expected_received(xs, ids, rank, local):
    """Rows sent to rank's experts: by local expert, then source rank, then token order."""
    rows, counts = [], torch.zeros(len(xs), local, dtype=torch.long)
    for j in range(rank * local, (rank + 1) * local):
        for s, (x, e) in enumerate(zip(xs, ids)):
            picked = x[e == j]
            rows.append(picked)
            counts[s, j - rank * local] = picked.shape[0]
    return torch.cat(rows), counts


def _define(d, tokens, experts, mesh):
    """tokens -> sorted by expert -> dispatch -> per-expert matmul (grouped_mm) -> combine -> unsorted."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([tokens, HIDDEN], name="tokens")
        ids = fd.define_tensor([tokens], dtype=DataType.Int, name="expert_ids")
        w = fd.define_tensor([experts // d, HIDDEN, HIDDEN], name="local_experts")
        order = fd.ops.argsort(ids, dim=0, stable=True)
        routed = fd.ops.index_select(x, 0, order)
        counts = fd.ops.bincount(ids, experts)
        received, recv_counts = fd.ops.all_to_all_dispatch(routed, counts, mesh)
        offsets = fd.ops.cumsum(fd.ops.sum(recv_counts, [0]), 0, dtype=DataType.Int32)
        y = fd.ops.grouped_mm(received, w, offsets)
        back = fd.ops.all_to_all_combine(y, counts, recv_counts)
        out = fd.ops.index_add(fd.ops.mul(x, 0.0), 0, order, back)
        for t in (received, recv_counts, out):
            fd.add_output(t)
        for t in (x, ids, w):
            t.set_device_mesh(mesh)
    return fd


@pytest.mark.parametrize("skew", [False, True], ids=["random", "uneven_and_empty_experts"])
def test_dispatch_and_combine(multidevice_test, skew):
    d, rank = multidevice_test.size, multidevice_test.rank
    tokens, experts = 6, 2 * d + (2 if d == 1 else 0)  # one rank: 4 experts; else 2 per rank
    local = experts // d
    mesh = DeviceMesh(range(d))
    xs, ids = _routing(d, tokens, experts, seed=11, skew=skew)
    weights = torch.randn(experts, HIDDEN, HIDDEN) / 3
    fd = _define(d, tokens, experts, mesh)
    inputs = [t.to(multidevice_test.device) for t in (xs[rank], ids[rank], weights[rank * local:(rank + 1) * local])]
    (received, recv_counts, out), comms = execute_with_plan(fd, inputs)

    exp_rows, exp_counts = _expected_received(xs, ids, rank, local)
    torch.testing.assert_close(received.cpu(), exp_rows)
    torch.testing.assert_close(recv_counts.cpu(), exp_counts)
    reference = torch.einsum("th,thk->tk", xs[rank], weights[ids[rank]])
    torch.testing.assert_close(out.cpu(), reference, rtol=1e-5, atol=1e-5)

    # The plan: the counts' AllToAll, then the rows' AllToAllV both ways, with the routing's bytes.
    assert [kind for kind, _, _ in comms] == ["AllToAll", "AllToAllV", "AllToAllV"]
    row = HIDDEN * 4
    block = lambda r: range(r * local, (r + 1) * local)  # noqa: E731
    sent_rows = sum(int((ids[rank] == e).sum()) for r in range(d) if r != rank for e in block(r))
    recv_rows = sum(int((ids[s] == e).sum()) for s in range(d) if s != rank for e in block(rank))
    assert comms[0][1:] == ((d - 1) * (local + 1) * 8,) * 2
    assert comms[1][1:] == (sent_rows * row, recv_rows * row)
    assert comms[2][1:] == (recv_rows * row, sent_rows * row)
    text = fd.host_program()
    assert "AllToAllV" in text and "dispatch: splits from" in text and "an extent bound at run time" in text
    assert "Rows received by" in text and f" = {exp_rows.shape[0]}\n" in text
    assert f"sent={sent_rows * row} received={recv_rows * row}" in text


def test_every_rank_raises_for_one_rank_bad_counts(multidevice_test):
    """Counts that do not cover the rows on one rank: every rank raises, before any row moves."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, HIDDEN], name="tokens")
        counts = fd.define_tensor([d], dtype=DataType.Int, name="counts")
        received, _ = fd.ops.all_to_all_dispatch(x, counts, mesh)
        fd.add_output(received)
        for t in (x, counts):
            t.set_device_mesh(mesh)
    good = torch.zeros(d, dtype=torch.long)
    good[0] = 4
    bad_rank = d - 1
    counts_here = good.clone()
    if rank == bad_rank:
        counts_here[0] = 3
    match = rf"all_to_all_dispatch: the expert counts of rank\(s\) \[{bad_rank}\] do not cover their token rows"
    with pytest.raises(meshfuser.Error, match=match):
        fd.execute([torch.randn(4, HIDDEN).to(multidevice_test.device), counts_here.to(multidevice_test.device)])
    # The ranks stay in step: the next call works.
    (received,) = fd.execute([torch.ones(4, HIDDEN).to(multidevice_test.device), good.to(multidevice_test.device)])
    assert received.shape == ((4 * d, HIDDEN) if rank == 0 else (0, HIDDEN))
