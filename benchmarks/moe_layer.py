"""The mixture-of-experts layer (examples/moe_layer.py: softmax router, top-k routed grouped SwiGLU
experts, one shared expert), forward and forward+backward: meshfuser against the same layer in
PyTorch eager (torch._grouped_mm on CUDA) and under torch.compile, in one run, printing ratios.

    python benchmarks/moe_layer.py                     # one GPU (or CPU: a tiny smoke run)
    torchrun --nproc_per_node=8 benchmarks/moe_layer.py

Defaults (DeepSeek-like proportions): bf16, 8192 tokens, hidden 4096, expert ffn 1536, 64 experts,
top-6, one shared expert of ffn 1536. On N ranks the experts are split N ways (expert parallelism:
each rank routes its own 8192 tokens, an AllToAll of the counts and an AllToAllV of the rows move
them to their experts, the reverse AllToAllV brings them back); PyTorch runs the same exchange with
all_to_all_single (autograd through torch's functional collectives), and the script also prints
meshfuser's dispatch/combine bytes and times per rank."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import meshfuser
from common import print_table, rank_setup, time_ms, training_step, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import moe_layer as moe  # noqa: E402


def layer_flops(cfg):
    """Forward FLOPs: router, k routed and one shared SwiGLU expert per token (3 GEMMs each)."""
    t, h = cfg.tokens, cfg.hidden
    return 2 * t * h * cfg.experts + 6 * t * h * (cfg.topk * cfg.ffn + cfg.shared_ffn)


def grouped_mm_for(device, dtype):
    """torch._grouped_mm where PyTorch has it for these tensors (CUDA bf16), else the loop."""
    if device.type == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
        return lambda a, b, offs: torch._grouped_mm(a, b, offs=offs)
    return moe.grouped_mm_loop


# ---- PyTorch with expert parallelism: the same exchange through all_to_all_single -------------
def _all_to_all(x, out_rows, in_rows, group):
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
    return wait_tensor(all_to_all_single_autograd(x, out_rows, in_rows, group))


def torch_moe_ep(p, topk, experts, group, ep, grouped_mm):
    """The layer on this rank's tokens with this rank's experts (p['w_*'] hold experts/ep)."""
    x = p["x"]
    local = experts // ep
    probs = torch.softmax(F.linear(x, p["router"]).float(), dim=-1)
    weights, chosen = torch.topk(probs, topk, dim=-1)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // topk
    counts = torch.bincount(flat, minlength=experts)
    recv_counts = torch.empty_like(counts)
    torch.distributed.all_to_all_single(recv_counts, counts, group=group)
    send_rows = counts.view(ep, local).sum(1).tolist()
    by_source = recv_counts.view(ep, local)
    recv_rows = by_source.sum(1).tolist()
    received = _all_to_all(x[token_of], recv_rows, send_rows, group)
    # regroup (source, expert) -> (expert, source)
    chunks = torch.arange(received.shape[0], device=x.device).split(by_source.flatten().tolist())
    regroup = torch.cat([chunks[s * local + j] for j in range(local) for s in range(ep)])
    offs = by_source.sum(0).cumsum(0).to(torch.int32)
    rows = received[regroup]
    act = F.silu(grouped_mm(rows, p["w_gate"], offs)) * grouped_mm(rows, p["w_up"], offs)
    out = grouped_mm(act, p["w_down"], offs)
    back = _all_to_all(out[torch.argsort(regroup)], send_rows, recv_rows, group)
    back = back * weights.reshape(-1)[order].to(x.dtype).unsqueeze(-1)
    shared = F.linear(F.silu(F.linear(x, p["s_gate"])) * F.linear(x, p["s_up"]), p["s_down"])
    return torch.zeros_like(x).index_add(0, token_of, back) + shared


def exchange_profile(fd, inputs):
    """meshfuser's AllToAll/AllToAllV steps of one call: (name, bytes sent, bytes received, ms)."""
    with meshfuser.Profiler() as prof:
        fd.execute(inputs)
    return [(k.name.split(" (")[0], k.bytes_sent, k.bytes_received, k.time_ms)
            for k in prof.profile.kernel_profiles if k.scheduler == "communication"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=1536, help="each routed expert's ffn")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--topk", type=int, default=6)
    parser.add_argument("--shared-ffn", type=int, default=1536)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="torch.profiler kernel classes per impl (GPU)")
    args = parser.parse_args()

    d, rank, device, dtype = rank_setup()
    cuda = device.type == "cuda"
    cfg = moe.MoeConfig(tokens=args.tokens, hidden=args.hidden, ffn=args.ffn, experts=args.experts, topk=args.topk,
                        shared_ffn=args.shared_ffn, dtype=dtype)
    if not cuda:  # CPU: a smoke run of the same code
        cfg = moe.MoeConfig(tokens=min(cfg.tokens, 32), hidden=min(cfg.hidden, 64), ffn=min(cfg.ffn, 32),
                            experts=max(d, min(cfg.experts, 8)), topk=min(cfg.topk, 2),
                            shared_ffn=min(cfg.shared_ffn, 32), dtype=dtype)
    assert cfg.experts % d == 0, "the experts must split evenly over the ranks"
    mesh = moe.make_mesh(d, 1)
    group = torch.distributed.group.WORLD if d > 1 else None

    params = moe.make_params(cfg, d, device)
    grad_y = torch.randn(d * cfg.tokens, cfg.hidden, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    inputs = moe.local_inputs(params, cfg, mesh, rank)
    train_inputs = moe.local_inputs(params, cfg, mesh, rank, grad_y)
    gy = train_inputs[-1]

    with meshfuser.FusionDefinition() as fwd:
        moe.define_moe(fwd, cfg, mesh)
    train = None
    if not args.no_backward:
        with meshfuser.FusionDefinition() as train:
            moe.define_moe(train, cfg, mesh, training=True)

    def mf_forward():
        return fwd.execute(inputs)

    def mf_step():
        return train.execute(train_inputs)

    local = {name: t.detach().clone().requires_grad_(True) for name, t in zip(moe.PARAMS, inputs)}
    grouped_mm = grouped_mm_for(device, dtype)
    if d == 1:
        layer = lambda p: moe.torch_moe(p, cfg.topk, grouped_mm)  # noqa: E731
    else:
        layer = lambda p: torch_moe_ep(p, cfg.topk, cfg.experts, group, d, grouped_mm)  # noqa: E731
    eager = lambda: layer(local)  # noqa: E731
    compiled_layer = None if args.no_compile else torch.compile(layer, dynamic=False)
    compiled = None if compiled_layer is None else (lambda: compiled_layer(local))

    def step(fn):
        return training_step(fn, gy, list(local.values()))

    # The results agree before anything is timed.
    with torch.no_grad():
        ref = eager()
    got = mf_forward()[0]
    err = (got.float() - ref.float()).abs().max().item()
    tol = 0.1 if dtype == torch.bfloat16 else 1e-3
    assert err < tol * max(1.0, ref.float().abs().max().item()), f"meshfuser forward differs from eager by {err}"

    rows = []
    flops = layer_flops(cfg)

    def measure(name, fwd_fn, step_fn):
        row = {"impl": name}
        with torch.no_grad():
            row["fwd_ms"] = time_ms(fwd_fn, warmup=3, iters=args.iters, batch=1)
        if step_fn is not None:
            row["fwd_bwd_ms"] = time_ms(step_fn, warmup=3, iters=args.iters, batch=1)
        row["fwd_tflops"] = flops / (row["fwd_ms"] * 1e-3) / 1e12
        if "fwd_bwd_ms" in row:
            row["fwd_bwd_tflops"] = 3 * flops / (row["fwd_bwd_ms"] * 1e-3) / 1e12
        rows.append(row)

    measure("meshfuser", mf_forward, None if train is None else mf_step)
    measure("eager", eager, None if args.no_backward else step(eager))
    if compiled is not None:
        measure("torch.compile", compiled, None if args.no_backward else step(compiled))
    base = {r["impl"]: r for r in rows}
    for r in rows:
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if key in r and key in base["eager"]:
                r[f"{key[:-3]}_vs_eager"] = base["eager"][key] / r[key]
            if key in r and "torch.compile" in base and key in base["torch.compile"]:
                r[f"{key[:-3]}_vs_compile"] = base["torch.compile"][key] / r[key]
    if args.breakdown and cuda and rank == 0:
        from kernel_breakdown import breakdown_ms, print_breakdown
        impls = {"meshfuser": (mf_forward, None if train is None else mf_step), "eager": (eager, step(eager))}
        if compiled is not None:
            impls["torch.compile"] = (compiled, step(compiled))
        with torch.no_grad():
            print_breakdown("MoE layer forward", {name: breakdown_ms(f) for name, (f, _) in impls.items()})
        if not args.no_backward:
            print_breakdown("MoE layer forward+backward", {name: breakdown_ms(st) for name, (_, st) in impls.items()})
    exchanges = exchange_profile(fwd, inputs) if d > 1 else []
    if rank == 0:
        title = (f"MoE layer on {d} rank(s) ({device.type}), {cfg.tokens} tokens/rank, hidden {cfg.hidden}, "
                 f"ffn {cfg.ffn}, {cfg.experts} experts, top-{cfg.topk} + shared ffn {cfg.shared_ffn}, "
                 f"{str(dtype).split('.')[-1]} (ratios: above 1 means meshfuser is faster)")
        columns = ["impl", "fwd_ms", "fwd_tflops", "fwd_vs_eager", "fwd_vs_compile", "fwd_bwd_ms", "fwd_bwd_tflops",
                   "fwd_bwd_vs_eager", "fwd_bwd_vs_compile"]
        print_table(title, rows, columns)
    for r in range(d if d > 1 else 0):
        if r == rank:
            table = [{"rank": rank, "communication": name, "bytes_sent": sent, "bytes_received": received, "ms": ms}
                     for name, sent, received, ms in exchanges]
            print_table(f"meshfuser forward exchanges on rank {rank} (dispatch, then combine)", table,
                        ["rank", "communication", "bytes_sent", "bytes_received", "ms"])
        torch.distributed.barrier()
    if rank == 0:
        write_json(f"moe_layer_{d}.json", {"args": vars(args), "rows": rows, "exchanges_rank0": exchanges})


if __name__ == "__main__":
    main()
