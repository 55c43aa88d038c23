"""The GPT block (examples/transformer_blocks.py), forward and forward+backward: meshfuser against
the same block in PyTorch eager and under torch.compile(dynamic=False), in one run, with achieved
TFLOP/s and peak memory.

    python benchmarks/transformer_block.py                        # one GPU (or CPU, tiny shapes)
    torchrun --nproc_per_node=2 benchmarks/transformer_block.py --form sp

On N ranks every implementation is sharded the same way (Megatron): TP keeps activations
replicated (an Allreduce after each row-parallel linear), SP splits them on the sequence (an
Allgather before each column-parallel part, a ReduceScatter after each row-parallel one). The
PyTorch versions use functional collectives so that torch.compile sees them.
Defaults: bf16, hidden 4096, 32 heads, sequence 8192, batch 1 (the figures in the notes)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfuser
from common import print_table, time_ms, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import transformer_blocks as blocks  # noqa: E402


def block_flops(b, s, e, causal=True):
    """Forward FLOPs: 24*b*s*e^2 in the linears (q, k, v, o: 4 e^2; MLP: 8 e^2; 2 per MAC) and
    4*b*s^2*e in attention (QK^T and PV), halved when causal."""
    attention = 4 * b * s * s * e * (0.5 if causal else 1.0)
    return 24 * b * s * e * e + attention


# ---- PyTorch: the same block, Megatron-sharded with functional collectives ----------------------
class _CopyToParallel(torch.autograd.Function):
    """Identity forward; Allreduce of the gradient (the input of column-parallel linears, TP)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _funcol().all_reduce(g, "sum", ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    """Allreduce forward (after row-parallel linears, TP); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _funcol().all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherSequence(torch.autograd.Function):
    """Allgather on the sequence forward (SP, before column-parallel parts); ReduceScatter back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _funcol().all_gather_tensor(x, 1, group)

    @staticmethod
    def backward(ctx, g):
        return _funcol().reduce_scatter_tensor(g, "sum", 1, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """ReduceScatter on the sequence forward (SP, after row-parallel linears); Allgather back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _funcol().reduce_scatter_tensor(x, "sum", 1, group)

    @staticmethod
    def backward(ctx, g):
        return _funcol().all_gather_tensor(g, 1, ctx.group), None


def _funcol():
    import torch.distributed._functional_collectives as funcol

    return funcol


def torch_block(p, x, hd, form, group, d):
    """Forward of this rank's part of the block. p holds this rank's shards; x is replicated (TP)
    or this rank's sequence slice (SP)."""
    b, e = x.shape[0], x.shape[2]
    gather = (lambda t: _GatherSequence.apply(t, group)) if form == "sp" and d > 1 else (
        (lambda t: _CopyToParallel.apply(t, group)) if d > 1 else (lambda t: t))
    reduce = (lambda t: _ScatterSequence.apply(t, group)) if form == "sp" and d > 1 else (
        (lambda t: _ReduceFromParallel.apply(t, group)) if d > 1 else (lambda t: t))
    ln0 = gather(F.layer_norm(x, [e], p["ln0_w"], p["ln0_b"], blocks.EPS))
    s = ln0.shape[1]
    heads = p["wq"].shape[0] // hd
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, heads, hd).transpose(1, 2) for n in "qkv")
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, heads * hd)
    res0 = x + reduce(F.linear(attn, p["wo"])) + p["bo"]
    ln1 = gather(F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], blocks.EPS))
    mlp = reduce(F.linear(F.gelu(F.linear(ln1, p["w1"], p["b1"])), p["w2"]))
    return res0 + mlp + p["b2"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--form", choices=["tp", "sp"], default="tp")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="torch.profiler kernel classes per impl")
    args = parser.parse_args()

    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", comm.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    b, s, e, h = args.batch, args.seq, args.hidden, args.heads
    if not cuda:  # CPU: a smoke run of the same code
        s, e, h = min(s, 64), min(e, 64), min(h, 4)
    hd = e // h
    assert h % d == 0 and s % d == 0, "heads and sequence must split evenly over the ranks"
    group = dist.group.WORLD if d > 1 else None

    full = blocks.gpt_parameters(b, s, e, seed=0, dtype=dtype)
    local = {n: t.to(device) for n, t in blocks.gpt_shard(full, args.form, d, rank).items()}
    x = local.pop("x")
    flops = block_flops(b, s, e)
    rows = []

    # meshfuser
    fwd = blocks.gpt_forward_definition(b, s, h, hd, d, args.form, blocks.to_meshfuser_dtype(dtype))
    bwd = None if args.no_backward else blocks.gpt_backward_definition(
        b, s, h, hd, d, args.form, blocks.to_meshfuser_dtype(dtype))
    mf_inputs = blocks.gpt_forward_inputs(x, local)

    def mf_forward():
        return fwd.execute(mf_inputs)

    def mf_step():
        outs = fwd.execute(mf_inputs)
        grad = torch.ones_like(outs[0])
        return bwd.execute(blocks.gpt_backward_inputs(grad, outs, x, local))

    # PyTorch eager and compiled, with autograd for the backward.
    params = {n: t.detach().clone().requires_grad_(True) for n, t in local.items()}
    x_req = x.detach().clone().requires_grad_(True)
    eager = lambda: torch_block(params, x_req, hd, args.form, group, d)  # noqa: E731
    compiled_fn = None if args.no_compile else torch.compile(torch_block, dynamic=False)
    compiled = None if compiled_fn is None else (lambda: compiled_fn(params, x_req, hd, args.form, group, d))

    def step(fn):
        def run():
            out = fn()
            out.backward(torch.ones_like(out))
        return run

    # The results agree before anything is timed.
    with torch.no_grad():
        ref = eager()
    got = mf_forward()[0]
    err = (got.float() - ref.float()).abs().max().item()
    tol = 0.1 if dtype == torch.bfloat16 else 1e-3
    assert err < tol * max(1.0, ref.float().abs().max().item()), f"meshfuser forward differs from eager by {err}"

    def measure(name, fwd_fn, step_fn):
        row = {"impl": name}
        with torch.no_grad():
            row["fwd_ms"] = time_ms(fwd_fn, warmup=3, iters=args.iters, batch=1)
            row["fwd_peak_gib"] = peak_gib(fwd_fn)
        if step_fn is not None:
            row["fwd_bwd_ms"] = time_ms(step_fn, warmup=3, iters=args.iters, batch=1)
            row["fwd_bwd_peak_gib"] = peak_gib(step_fn)
        row["fwd_tflops"] = flops / d / (row["fwd_ms"] * 1e-3) / 1e12
        if "fwd_bwd_ms" in row:
            row["fwd_bwd_tflops"] = 3 * flops / d / (row["fwd_bwd_ms"] * 1e-3) / 1e12
        rows.append(row)

    measure("meshfuser", mf_forward, None if bwd is None else mf_step)
    measure("eager", eager, None if args.no_backward else step(eager))
    if compiled is not None:
        measure("torch.compile", compiled, None if args.no_backward else step(compiled))
    base = {r["impl"]: r for r in rows}
    for r in rows:
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if key in r and "eager" in base and key in base["eager"]:
                r[f"{key[:-3]}_vs_eager"] = base["eager"][key] / r[key]
            if key in r and "torch.compile" in base and key in base["torch.compile"]:
                r[f"{key[:-3]}_vs_compile"] = base["torch.compile"][key] / r[key]
    if args.breakdown and cuda:
        from kernel_breakdown import breakdown_ms, print_breakdown
        impls = {"meshfuser": (mf_forward, mf_step), "eager": (eager, step(eager))}
        if compiled is not None:
            impls["torch.compile"] = (compiled, step(compiled))
        with torch.no_grad():
            fwd_parts = {name: breakdown_ms(f) for name, (f, _) in impls.items()}
        step_parts = {} if args.no_backward else {name: breakdown_ms(st) for name, (_, st) in impls.items()}
        if rank == 0:
            print_breakdown("GPT block forward", fwd_parts)
            if step_parts:
                print_breakdown("GPT block forward+backward", step_parts)
    if rank == 0:
        title = (f"GPT block, {args.form.upper()} on {d} rank(s) ({device.type}), b={b} s={s} e={e} heads={h}, "
                 f"{str(dtype).split('.')[-1]} (ratios: above 1 means meshfuser is faster)")
        columns = ["impl", "fwd_ms", "fwd_tflops", "fwd_peak_gib", "fwd_vs_eager", "fwd_vs_compile", "fwd_bwd_ms",
                   "fwd_bwd_tflops", "fwd_bwd_peak_gib", "fwd_bwd_vs_eager", "fwd_bwd_vs_compile"]
        print_table(title, rows, columns)
        write_json(f"transformer_block_{args.form}_{d}.json", {"args": vars(args), "rows": rows})


def peak_gib(fn):
    if not torch.cuda.is_available():
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


if __name__ == "__main__":
    main()
