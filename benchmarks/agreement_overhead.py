"""Cost of the per-call cross-rank agreement (README "Reliability across ranks"), beside eager
PyTorch doing the same work: the seed-001 layer (row-parallel linear + ReduceScatter, bf16), a tiny
Allgather program and a pointwise program without communication, each with the agreement on
(default), off (MESHFUSER_DISABLE=collective_validation) and strict (MESHFUSER_DISTRIBUTED_DEBUG=
DETAIL), timed back to back (as a training step issues layers) and with a synchronization after
every call. The control transport is the process's (shared memory by default on one host;
MESHFUSER_CONTROL_TRANSPORT=gloo for Gloo); run once per transport.
    torchrun --nproc_per_node=2 benchmarks/agreement_overhead.py
CUDA tensors on ranks sharing one GPU (NCCL refuses that): MESHFUSER_CUDA_BACKEND=gloo (the data
collectives on Gloo, which takes CUDA tensors for these)."""
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType, _C
from common import print_table, time_ms, write_json
from tp_linear import row_parallel_rs

MODES = [("agreement (default)", {}), ("off", {"MESHFUSER_DISABLE": "collective_validation"}),
         ("strict (DETAIL)", {"MESHFUSER_DISTRIBUTED_DEBUG": "DETAIL"})]


def set_mode(env):
    for k in ("MESHFUSER_DISABLE", "MESHFUSER_DISTRIBUTED_DEBUG"):
        os.environ.pop(k, None)
    os.environ.update(env)
    _C.reload_options()


def sharded_rows(d, rows, cols, op):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([rows, cols])
        out = fd.ops.set(x) if op == "set" else fd.ops.relu(x)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        if op != "set":  # stays sharded: no communication
            out.outer_split(0, d)
            out.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def main():
    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    cuda = torch.cuda.is_available()
    if cuda:
        dev = torch.device("cuda", comm.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        T = h = int(os.environ.get("MESHFUSER_BENCH_T", "4096"))
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        T = h = int(os.environ.get("MESHFUSER_BENCH_T", "256"))
        sync = lambda: None  # noqa: E731
    ffn = 4 * h
    x = torch.randn(T, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
    w = torch.randn(h, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
    rs_out = torch.empty(T // d, h, dtype=torch.bfloat16, device=dev)
    small = torch.randn(4, 4, device=dev)
    small_out = torch.empty(4 * d, 4, device=dev)
    pw = torch.randn(T // d, h, device=dev)

    def eager_seed001():
        dist.reduce_scatter_tensor(rs_out, F.linear(x, w))

    programs = [
        (f"seed 001, T=h={T}, bf16", row_parallel_rs(d, T, h, ffn), [x, w], eager_seed001),
        ("tiny Allgather [4d, 4]", sharded_rows(d, 4 * d, 4, "set"), [small],
         lambda: dist.all_gather_into_tensor(small_out, small)),
        (f"relu [{T}, {h}] sharded, no communication", sharded_rows(d, T, h, "relu"), [pw], lambda: torch.relu(pw)),
    ]
    repeats = int(os.environ.get("MESHFUSER_BENCH_REPEATS", "3"))
    rows = []
    for label, fd, args, eager in programs:
        best = {}
        for _ in range(repeats):  # modes interleaved, best median of each kept: robust to a noisy host
            for name, env in MODES + [("eager PyTorch", None)]:
                if env is not None:
                    set_mode(env)
                fn = eager if env is None else (lambda: fd.execute(args))
                fn()
                dist.barrier()
                b2b = time_ms(fn, warmup=5, iters=30)
                synced = time_ms(fn, warmup=5, iters=30, sync=sync)
                old = best.get(name, (float("inf"), float("inf")))
                best[name] = (min(old[0], b2b), min(old[1], synced))
        for name, _ in MODES + [("eager PyTorch", None)]:
            rows.append({"program": label, "mode": name, "back_to_back_ms": best[name][0],
                         "synchronized_ms": best[name][1]})
    set_mode({})
    for r in rows:
        base = next(b for b in rows if b["program"] == r["program"] and b["mode"] == "off")
        eager = next(b for b in rows if b["program"] == r["program"] and b["mode"] == "eager PyTorch")
        r["vs_eager_b2b"] = r["back_to_back_ms"] / eager["back_to_back_ms"]
        r["added_b2b_us"] = 1e3 * (r["back_to_back_ms"] - base["back_to_back_ms"])
        r["added_sync_us"] = 1e3 * (r["synchronized_ms"] - base["synchronized_ms"])
        r["added_b2b_pct"] = 100 * (r["back_to_back_ms"] / base["back_to_back_ms"] - 1)
    # One bare control round of 24 int64 (the header's size) through the process's transport.
    for _ in range(200):
        comm.exchange([0] * 24)
    dist.barrier()
    samples = []
    for _ in range(2000):
        t0 = time.perf_counter()
        comm.exchange([0] * 24)
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    if rank == 0:
        print(f"\nbare control round (24 int64), transport {comm.control_transport()}: median "
              f"{statistics.median(samples):.1f} us, p10 {samples[200]:.1f} us, p90 {samples[1800]:.1f} us")
    if rank == 0:
        where = torch.cuda.get_device_name(0) if cuda else "CPU"
        backend = dist.get_backend()
        transport = comm.control_transport()
        print_table(f"per-call agreement cost, {d} ranks, {where}, data backend {backend}, control transport "
                    f"{transport}", rows,
                    ["program", "mode", "back_to_back_ms", "synchronized_ms", "vs_eager_b2b", "added_b2b_us",
                     "added_sync_us", "added_b2b_pct"])
        write_json(f"agreement_overhead_{d}{'gpu' if cuda else 'cpu'}_{transport}.json",
                   {"device": where, "ranks": d, "backend": backend, "transport": transport, "rows": rows})
    dist.barrier()


if __name__ == "__main__":
    main()
