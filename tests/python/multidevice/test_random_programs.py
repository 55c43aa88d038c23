"""Random sharded programs against PyTorch (issue 17): pointwise chains, sums and sets with random
loop (one block per device, interleaved, or nested in a split by 2) and logical device splits, constant and symbolic extents, even and uneven. Every program either
computes the right shard on every rank or raises meshfuser.Error on every rank: never wrong data,
never a hang, never an error on some ranks only. Seeded: a failure names its case, and
MESHFUSER_RANDOM_CASE=<n> reruns that case alone."""
import os
import random

import pytest
import torch
import torch.distributed as dist

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

UNARY = ["relu", "neg", "tanh", "sigmoid", "abs"]


def _annotate(tv, mesh, sharding):
    tv.set_device_mesh(mesh)
    if sharding is None:
        return
    kind, axis = sharding
    if kind == "loop":
        tv.outer_split(axis, mesh.size)
    elif kind == "inner":  # interleaved: this device holds elements i*d + rank
        tv.inner_split(axis, mesh.size)
        axis += 1
    elif kind == "nested":  # [2, d, rest]: this device's block of each half
        tv.outer_split(axis, 2)
        tv.outer_split(axis + 1, mesh.size)
        axis += 1
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _shard_of(t, sharding, d, rank):
    """This rank's piece of t (torch.chunk: uneven when the extent does not divide)."""
    if sharding is None:
        return t
    kind, axis = sharding
    if kind == "logical":
        return t.narrow(axis, rank, 1)
    if kind in ("inner", "nested") and d == 1:
        return t
    if kind in ("inner", "nested") and d > 1:  # (one device holds everything, in order)
        parts = 2 * d if kind == "nested" else d
        if t.size(axis) % parts:
            # does not divide: torch.chunk's pieces, which the program must refuse on every rank
            pieces = t.chunk(d, dim=axis)
            return pieces[rank] if rank < len(pieces) else t.narrow(axis, 0, 0)
        if kind == "inner":
            return t.unflatten(axis, (-1, d)).select(axis + 1, rank)
        return t.unflatten(axis, (2, d, -1)).select(axis + 1, rank).flatten(axis, axis + 1)
    pieces = t.chunk(d, dim=axis)
    return pieces[rank] if rank < len(pieces) else t.narrow(axis, 0, 0)


def _make_case(seed, d):
    rng = random.Random(seed)
    ndim = rng.choice([1, 2, 3])
    choices = [2 * d, 3 * d, 4 * d] + ([] if d == 1 else [2 * d + 1, 3, 5])  # some do not divide
    shape = [rng.choice(choices) for _ in range(ndim)]
    logical = rng.randrange(ndim) if d >= 2 and rng.random() < 0.25 else None
    if logical is not None:
        shape[logical] = d  # a logical device split: the axis is the device axis
    symbolic = [rng.random() < 0.3 and a != logical for a in range(ndim)]

    def pick(n_axes, logical_axis):
        r = rng.random()
        if r < 0.3:
            return None
        if logical_axis is not None and r < 0.5:
            return ("logical", logical_axis)
        kind = rng.choices(["loop", "inner", "nested"], weights=[6, 3, 1])[0]
        return (kind, rng.randrange(n_axes))

    case = dict(shape=shape, symbolic=symbolic, x=pick(ndim, logical), two=rng.random() < 0.4)
    case["y"] = pick(ndim, logical)
    case["ops"] = [rng.choice(UNARY + ["add_y", "mul_y", "scale"]) for _ in range(rng.randint(1, 3))]
    case["sum"] = rng.randrange(ndim) if ndim > 1 and rng.random() < 0.4 else None
    out_ndim = ndim - (case["sum"] is not None)
    out_logical = logical
    if case["sum"] is not None and logical is not None:
        out_logical = None if case["sum"] == logical else logical - (case["sum"] < logical)
    case["out"] = pick(out_ndim, out_logical)
    return case


def _run_case(case, d, rank, device):
    mesh = DeviceMesh(range(d))
    dims = [-1 if s else e for s, e in zip(case["symbolic"], case["shape"])]
    with FusionDefinition() as fd:
        x = fd.define_tensor(dims)
        inputs_tv = [x]
        y = fd.define_tensor(dims) if case["two"] else None
        if y is not None:
            inputs_tv.append(y)
        t = x
        for op in case["ops"]:
            if op in ("add_y", "mul_y") and y is not None:
                t = fd.ops.add(t, y) if op == "add_y" else fd.ops.mul(t, y)
            elif op == "scale":
                t = fd.ops.mul(t, 0.5)
            else:
                t = getattr(fd.ops, op if op in UNARY else "relu")(t)
        if case["sum"] is not None:
            t = fd.ops.sum(t, [case["sum"]])
        out = fd.ops.set(t)
        fd.add_output(out)
        _annotate(x, mesh, case["x"])
        if y is not None:
            _annotate(y, mesh, case["y"])
        _annotate(out, mesh, case["out"])

    gen = torch.Generator().manual_seed(1234)
    xs = torch.randn(case["shape"], generator=gen)
    ys = torch.randn(case["shape"], generator=gen)
    ref = xs
    for op in case["ops"]:
        if op in ("add_y", "mul_y") and case["two"]:
            ref = ref + ys if op == "add_y" else ref * ys
        elif op == "scale":
            ref = ref * 0.5
        else:
            ref = getattr(torch, op if op in UNARY else "relu")(ref)
    if case["sum"] is not None:
        ref = ref.sum(case["sum"])
    args = [_shard_of(xs, case["x"], d, rank).to(device)]
    if case["two"]:
        args.append(_shard_of(ys, case["y"], d, rank).to(device))
    try:
        (result,) = fd.execute(args)
    except meshfuser.Error as e:
        return "error", str(e)
    expected = _shard_of(ref, case["out"], d, rank)
    torch.testing.assert_close(result.cpu(), expected, msg=lambda m: f"{case}: {m}")
    return "ok", ""


def test_random_programs(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    only = os.environ.get("MESHFUSER_RANDOM_CASE")
    n = int(os.environ.get("MESHFUSER_RANDOM_PROGRAMS", "300" if d > 1 else "100"))
    cases = [int(only)] if only else range(n)
    counts = {"ok": 0, "error": 0}
    errors = {}
    for seed in cases:
        case = _make_case(seed, d)
        try:
            status, msg = _run_case(case, d, rank, multidevice_test.device)
        except Exception as e:  # an internal error or wrong numbers: name the case to rerun it
            raise AssertionError(f"case {seed} (MESHFUSER_RANDOM_CASE={seed}) {case}: {e}") from e
        counts[status] += 1
        if status == "error":
            errors[seed] = msg
        # Every rank must reach the same outcome (exchanged on the user's default group).
        mine = torch.tensor([1 if status == "ok" else 0], dtype=torch.long)
        everyone = [torch.zeros_like(mine) for _ in range(d)]
        dist.all_gather(everyone, mine)
        outcomes = [int(t.item()) for t in everyone]
        assert len(set(outcomes)) == 1, f"case {seed} {case}: outcomes per rank {outcomes} (1 = ok); {msg}"
    print(f"random programs on {d} rank(s): {counts}")
    if not only:
        # The generator must exercise both paths; most programs are supported.
        assert counts["ok"] >= n // 3, (counts, list(errors.items())[:5])
        if d > 1:
            assert counts["error"] > 0, counts
    if os.environ.get("MESHFUSER_RANDOM_VERBOSE"):
        for seed, msg in errors.items():
            print(f"case {seed}: {_make_case(seed, d)}\n  {msg[:240]}")
    for msg in errors.values():  # refusals name the tensor or input and say why
        assert ("input" in msg or "T" in msg) and len(msg) > 40, msg
