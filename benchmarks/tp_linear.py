"""Tensor-parallel linear layers on N GPUs (torchrun; 1 GPU works too), meshfuser against PyTorch
eager in the same process: row-parallel linear + ReduceScatter (seed 001) and AllGather +
column-parallel linear, bf16, each plain and overlapped (ParallelType.stream: 2 and 4 chunks, and
the ring); plus meshfuser's collectives against torch.distributed's for 16-512 MiB. Prints ratios
(meshfuser / eager: below 1 is faster; meshfuser / max(GEMM, collective) measured in the same run:
1.0 is perfect overlap) and peak memory, and writes JSON."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType
from common import print_table, time_ms, write_json


def row_parallel_rs(d, T, h, ffn, variant="plain"):
    """variant: "plain", "chunks=<s>" (each device's output rows in s stream chunks) or "ring"."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([T, ffn], dtype=DataType.BFloat16)
        w = fd.define_tensor([h, ffn], dtype=DataType.BFloat16)
        out = fd.ops.linear(x, w)
        fd.add_output(out)
    for tv in (x, w, out):
        tv.set_device_mesh(mesh)
        tv.outer_split(-1, d)
        tv.axis(-2).parallelize(ParallelType.mesh_x)
    out.outer_split(0, d)
    out.axis(0).parallelize(ParallelType.mesh_x)
    if variant.startswith("chunks="):
        out.outer_split(1, int(variant[7:]))
        out.axis(1).parallelize(ParallelType.stream)
    elif variant == "ring":
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.stream)
        x.swizzle1d(0, ParallelType.mesh_x)
    return fd


def column_parallel_ag(d, T, h, ffn, variant="plain"):
    """variant: "plain", "chunks=<s>" (each device's rows gathered in s stream chunks) or "ring"."""
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([T, h], dtype=DataType.BFloat16)
        w = fd.define_tensor([ffn, h], dtype=DataType.BFloat16)
        xg = fd.ops.set(x) if variant != "plain" else x
        out = fd.ops.linear(xg, w)
        fd.add_output(out)
    for tv in (x, w, out):
        tv.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    w.outer_split(0, d)
    w.axis(0).parallelize(ParallelType.mesh_x)
    out.outer_split(1, d)
    out.axis(1).parallelize(ParallelType.mesh_x)
    if variant != "plain":
        xg.set_device_mesh(mesh)
        xg.outer_split(0, d)
        if variant == "ring":
            xg.axis(0).parallelize(ParallelType.stream)
            xg.swizzle1d(0, ParallelType.mesh_x)
        else:
            xg.outer_split(1, int(variant[7:]))
            xg.axis(1).parallelize(ParallelType.stream)
    return fd


VARIANTS = ["plain", "chunks=2", "chunks=4", "ring"]


def peak_mib(fn):
    """Peak memory allocated during one call, above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    dev = torch.device("cuda", comm.local_rank())
    torch.cuda.set_device(dev)
    rows, coll_rows = [], []
    for T, h in [(8192, 8192), (4096, 4096)]:
        ffn = 4 * h
        torch.manual_seed(0)
        # Row-parallel: x [T, ffn/d], w [h, ffn/d] -> partial [T, h] -> reduce-scatter on T.
        x = torch.randn(T, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
        w = torch.randn(h, ffn // d, dtype=torch.bfloat16, device=dev) * 0.05
        rs_out = torch.empty(T // d, h, dtype=torch.bfloat16, device=dev)

        def eager_rs():  # allocates its output per call, as a layer does
            out = torch.empty(T // d, h, dtype=torch.bfloat16, device=dev)
            dist.reduce_scatter_tensor(out, F.linear(x, w))
            return out

        gemm = time_ms(lambda: F.linear(x, w))
        partial = F.linear(x, w)
        rs_only = time_ms(lambda: dist.reduce_scatter_tensor(rs_out, partial))
        del partial
        e = time_ms(eager_rs)
        for variant in VARIANTS:
            fd = row_parallel_rs(d, T, h, ffn, variant)

            def mf_rs():
                return fd.execute([x, w])[0]

            torch.testing.assert_close(mf_rs(), eager_rs(), rtol=2e-2, atol=2e-2)
            m = time_ms(mf_rs)
            rows.append({"layer": "row-parallel linear + RS", "variant": variant, "T": T, "h": h, "gemm_ms": gemm,
                         "collective_ms": rs_only, "eager_ms": e, "meshfuser_ms": m, "ratio": m / e,
                         "vs_max": m / max(gemm, rs_only), "eager_peak_MiB": peak_mib(eager_rs),
                         "meshfuser_peak_MiB": peak_mib(mf_rs)})
        del x, w, rs_out
        torch.cuda.empty_cache()
        # Column-parallel: x [T/d, h] all-gathered on T, w [ffn/d, h] -> out [T, ffn/d].
        x = torch.randn(T // d, h, dtype=torch.bfloat16, device=dev) * 0.05
        w = torch.randn(ffn // d, h, dtype=torch.bfloat16, device=dev) * 0.05
        full = torch.empty(T, h, dtype=torch.bfloat16, device=dev)

        def eager_ag():  # allocates the gathered input per call, as a layer does
            gathered = torch.empty(T, h, dtype=torch.bfloat16, device=dev)
            dist.all_gather_into_tensor(gathered, x)
            return F.linear(gathered, w)

        gemm = time_ms(lambda: F.linear(full, w))
        ag_only = time_ms(lambda: dist.all_gather_into_tensor(full, x))
        e = time_ms(eager_ag)
        for variant in VARIANTS:
            fd = column_parallel_ag(d, T, h, ffn, variant)

            def mf_ag():
                return fd.execute([x, w])[0]

            torch.testing.assert_close(mf_ag(), eager_ag(), rtol=2e-2, atol=2e-2)
            m = time_ms(mf_ag)
            rows.append({"layer": "AG + column-parallel linear", "variant": variant, "T": T, "h": h,
                         "gemm_ms": gemm, "collective_ms": ag_only, "eager_ms": e, "meshfuser_ms": m,
                         "ratio": m / e, "vs_max": m / max(gemm, ag_only), "eager_peak_MiB": peak_mib(eager_ag),
                         "meshfuser_peak_MiB": peak_mib(mf_ag)})
        del x, w, full
        torch.cuda.empty_cache()
    team = list(range(d))
    for mib in [16, 64, 256, 512]:
        n = mib * 2**20 // 2
        inp = torch.randn(n, dtype=torch.bfloat16, device=dev)
        out_rs = torch.empty(n // d, dtype=torch.bfloat16, device=dev)
        out_ag = torch.empty(n * d, dtype=torch.bfloat16, device=dev)
        for name, mf_fn, eager_fn in [
            ("reduce_scatter", lambda: comm.reduce_scatter(team, out_rs, inp).wait(),
             lambda: dist.reduce_scatter_tensor(out_rs, inp)),
            ("allgather", lambda: comm.allgather(team, out_ag, inp).wait(),
             lambda: dist.all_gather_into_tensor(out_ag, inp)),
            ("allreduce", lambda: comm.allreduce(team, inp).wait(), lambda: dist.all_reduce(inp)),
        ]:
            e, m = time_ms(eager_fn), time_ms(mf_fn)
            coll_rows.append({"collective": name, "MiB": mib, "eager_ms": e, "meshfuser_ms": m, "ratio": m / e})
        del inp, out_rs, out_ag
    if rank == 0:
        name = torch.cuda.get_device_name(dev)
        print_table(f"tensor-parallel linear, bf16, {d} x {name}", rows,
                    ["layer", "variant", "T", "h", "gemm_ms", "collective_ms", "eager_ms", "meshfuser_ms", "ratio",
                     "vs_max", "eager_peak_MiB", "meshfuser_peak_MiB"])
        print_table(f"collectives, bf16, {d} x {name}", coll_rows, ["collective", "MiB", "eager_ms", "meshfuser_ms", "ratio"])
        write_json(f"tp_linear_{d}gpu.json", {"device": name, "ranks": d, "layers": rows, "collectives": coll_rows})
    dist.barrier()


if __name__ == "__main__":
    main()
