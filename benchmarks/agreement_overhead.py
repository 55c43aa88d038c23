"""Cost of the per-call cross-rank agreement (README "Reliability across ranks"): the seed-001 layer
(row-parallel linear + ReduceScatter, bf16, T=h=4096, ffn=4h) with the agreement on (default), off
(MESHFUSER_DISABLE=collective_validation) and strict (MESHFUSER_DISTRIBUTED_DEBUG=DETAIL), timed
back to back (as a training step issues layers) and with a synchronization after every call. On a
CPU-only machine it times a tiny Allgather program on CPU ranks instead.
    torchrun --nproc_per_node=2 benchmarks/agreement_overhead.py"""
import os

import torch
import torch.distributed as dist

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType, _C
from common import print_table, time_ms, write_json
from tp_linear import row_parallel_rs

MODES = [("agreement (default)", {}), ("off", {"MESHFUSER_DISABLE": "collective_validation"}),
         ("strict (DETAIL)", {"MESHFUSER_DISTRIBUTED_DEBUG": "DETAIL"})]


def set_mode(env):
    for k in ("MESHFUSER_DISABLE", "MESHFUSER_DISTRIBUTED_DEBUG"):
        os.environ.pop(k, None)
    os.environ.update(env)
    _C.reload_options()


def tiny_program(d):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4 * d, 4])
        out = fd.ops.set(x)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
    return fd


def main():
    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    cuda = torch.cuda.is_available()
    rows = []
    if cuda:
        dev = torch.device("cuda", comm.local_rank())
        torch.cuda.set_device(dev)
        T = h = int(os.environ.get("MESHFUSER_BENCH_T", "4096"))
        ffn = 4 * h
        x = torch.randn(T, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
        w = torch.randn(h, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
        fd, args, label = row_parallel_rs(d, T, h, ffn), [x, w], f"seed 001, T=h={T}, bf16"
        sync = torch.cuda.synchronize
    else:
        x = torch.randn(4, 4)
        fd, args, label = tiny_program(d), [x], "tiny Allgather program, CPU"
        sync = lambda: None  # noqa: E731
    for name, env in MODES:
        set_mode(env)
        fd.execute(args)
        dist.barrier()
        back_to_back = time_ms(lambda: fd.execute(args), warmup=10, iters=50)
        synced = time_ms(lambda: fd.execute(args), warmup=10, iters=50, sync=sync)
        rows.append({"mode": name, "back_to_back_ms": back_to_back, "synchronized_ms": synced})
    set_mode({})
    base = rows[1]
    for r in rows:
        r["overhead_b2b_pct"] = 100 * (r["back_to_back_ms"] / base["back_to_back_ms"] - 1)
        r["overhead_sync_pct"] = 100 * (r["synchronized_ms"] / base["synchronized_ms"] - 1)
        r["added_sync_us"] = 1e3 * (r["synchronized_ms"] - base["synchronized_ms"])
    if rank == 0:
        where = torch.cuda.get_device_name(0) if cuda else "CPU (Gloo)"
        print_table(f"per-call agreement cost, {label}, {d} x {where}", rows,
                    ["mode", "back_to_back_ms", "synchronized_ms", "overhead_b2b_pct", "overhead_sync_pct",
                     "added_sync_us"])
        write_json(f"agreement_overhead_{d}{'gpu' if cuda else 'cpu'}.json", {"device": where, "ranks": d, "rows": rows})
    dist.barrier()


if __name__ == "__main__":
    main()
