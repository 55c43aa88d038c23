"""A transformer block (examples/transformer_blocks.py), forward and forward+backward: meshfuser
against the same block in PyTorch eager and under torch.compile(dynamic=False), in one run, with
achieved TFLOP/s and peak memory; --breakdown splits each one's device time into GEMM, attention,
generated kernels, other ATen kernels and communication (torch.profiler).

    python benchmarks/transformer_block.py                        # one GPU (or CPU, tiny shapes)
    python benchmarks/transformer_block.py --block llama --breakdown
    torchrun --nproc_per_node=2 benchmarks/transformer_block.py --form sp

--block gpt: LayerNorm, biased q/k/v/o, GELU MLP of 4x hidden. --block llama: RMSNorm, bias-free
projections, grouped-query attention (--kv-heads, 8), RoPE, SiLU-gated MLP (--ffn, 14336).

On N ranks every implementation is sharded the same way (Megatron): TP keeps activations
replicated (an Allreduce after each row-parallel linear), SP splits them on the sequence (an
Allgather before each column-parallel part, a ReduceScatter after each row-parallel one). The
PyTorch versions use functional collectives so that torch.compile sees them.
Defaults: bf16, hidden 4096, 32 heads, sequence 8192, batch 1 (the figures in benchmarks/README.md). On
CPU a smoke run of the same code at tiny shapes (no breakdown: it reads the GPU's kernel timeline)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfuser
from common import host_ms, print_table, rank_setup, time_interleaved_ms, training_step, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import transformer_blocks as blocks  # noqa: E402


def block_flops(b, s, e, kv, ffn, mlp_matrices, causal=True):
    """Forward FLOPs, 2 per MAC: the projections (q and o: e x e; k and v: kv x e), the MLP
    (mlp_matrices of e x ffn) and attention (QK^T and PV: 4*b*s^2*e), halved when causal. GPT
    (kv = e, ffn = 4e, two matrices): 24*b*s*e^2 + attention."""
    linears = 2 * b * s * (2 * e * e + 2 * kv * e + mlp_matrices * e * ffn)
    return linears + 4 * b * s * s * e * (0.5 if causal else 1.0)


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


def _collectives(form, group, d):
    """(gather, reduce): what enters a column-parallel part and what leaves a row-parallel one."""
    gather = (lambda t: _GatherSequence.apply(t, group)) if form == "sp" and d > 1 else (
        (lambda t: _CopyToParallel.apply(t, group)) if d > 1 else (lambda t: t))
    reduce = (lambda t: _ScatterSequence.apply(t, group)) if form == "sp" and d > 1 else (
        (lambda t: _ReduceFromParallel.apply(t, group)) if d > 1 else (lambda t: t))
    return gather, reduce


def torch_block(p, x, hd, form, group, d):
    """Forward of this rank's part of the GPT block. p holds this rank's shards; x is replicated
    (TP) or this rank's sequence slice (SP)."""
    b, e = x.shape[0], x.shape[2]
    gather, reduce = _collectives(form, group, d)
    ln0 = gather(F.layer_norm(x, [e], p["ln0_w"], p["ln0_b"], blocks.EPS))
    s = ln0.shape[1]
    heads = p["wq"].shape[0] // hd
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, heads, hd).transpose(1, 2) for n in "qkv")
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, heads * hd)
    res0 = x + reduce(F.linear(attn, p["wo"])) + p["bo"]
    ln1 = gather(F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], blocks.EPS))
    mlp = reduce(F.linear(F.gelu(F.linear(ln1, p["w1"], p["b1"])), p["w2"]))
    return res0 + mlp + p["b2"]


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin


def torch_llama_block(p, x, hd, form, group, d):
    """Forward of this rank's part of the Llama-style block (as torch_block; cos/sin whole)."""
    b, e = x.shape[0], x.shape[2]
    gather, reduce = _collectives(form, group, d)
    normed = gather(F.rms_norm(x, [e], p["norm0_w"], blocks.EPS))
    s = normed.shape[1]
    q, k, v = (F.linear(normed, p[f"w{n}"]).view(b, s, -1, hd).transpose(1, 2) for n in "qkv")
    q, k = _rope(q, p["cos"], p["sin"]), _rope(k, p["cos"], p["sin"])
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, s, -1)
    res0 = x + reduce(F.linear(attn, p["wo"]))
    normed1 = gather(F.rms_norm(res0, [e], p["norm1_w"], blocks.EPS))
    return res0 + reduce(F.linear(F.silu(F.linear(normed1, p["w_gate"])) * F.linear(normed1, p["w_up"]), p["w_down"]))


def print_slowest_segments(title, fd, run, count=12):
    """The segments of `fd` that are neither GEMMs nor attention, slowest first, with their ops as
    the host program prints them (device times from meshfuser.Profiler, one call after a warm one)."""
    run()
    with meshfuser.Profiler() as prof:
        run()
    lines = {}
    for line in fd.host_program().splitlines():
        line = line.strip()
        if line.startswith("run segment "):
            lines[line.split(" ")[2]] = line
    rows = []
    for k in prof.profile.kernel_profiles:
        if k.scheduler in ("communication",) or not k.name.startswith("segment"):
            continue
        text = lines.get(k.name.split(" ")[1].split(".")[0], "")
        if k.scheduler == "expr_eval" and any(op in text for op in ("linear(", "matmul(", "sdpfa_")):
            continue
        rows.append((k.time_ms, k.name, k.scheduler, text))
    rows.sort(reverse=True)
    print(f"\n{title}: slowest segments other than GEMMs and attention (meshfuser.Profiler, device ms)")
    print(f"  total of these {sum(r[0] for r in rows):.3f} ms over {len(rows)} entries")
    for ms, name, scheduler, text in rows[:count]:
        print(f"  {ms:7.3f}  {name:<14} {scheduler:<13} {text[:150]}")


class Block:
    """One block's definitions (the forward alone; the forward saving activations, and the
    backward), parameters, inputs and PyTorch version, for --block gpt or llama."""

    def __init__(self, name, b, s, h, hd, d, form, dtype, kv_heads, ffn, backward):
        e, mf_dtype = h * hd, blocks.to_meshfuser_dtype(dtype)
        self.title = "GPT block" if name == "gpt" else f"Llama-style block (KV heads {kv_heads}, ffn {ffn})"
        if name == "gpt":
            self.full = blocks.gpt_parameters(b, s, e, seed=0, dtype=dtype)
            self.shard, self.torch_fn = blocks.gpt_shard, torch_block
            # The forward alone outputs the block output only (as Llama's): the saved activations are
            # the training forward's (the GPT forward's peak had been 0.157 GiB over compile's with them).
            self.forward = blocks.gpt_forward_definition(b, s, h, hd, d, form, mf_dtype, save=False)
            self.training_forward = blocks.gpt_forward_definition(b, s, h, hd, d, form, mf_dtype)
            self.backward = blocks.gpt_backward_definition(b, s, h, hd, d, form, mf_dtype) if backward else None
            self.forward_inputs, self.backward_inputs = blocks.gpt_forward_inputs, blocks.gpt_backward_inputs
            self.flops = block_flops(b, s, e, e, 4 * e, 2)
            return
        self.full = blocks.llama_parameters(b, s, e, hd, ffn, seed=0, dtype=dtype, kv_heads=kv_heads)
        self.shard, self.torch_fn = blocks.llama_shard, torch_llama_block
        sizes = (b, s, h, hd, ffn, d, form, mf_dtype, kv_heads)
        self.forward = blocks.llama_forward_definition(*sizes)
        self.training_forward = blocks.llama_forward_definition(*sizes, save=True)
        self.backward = blocks.llama_backward_definition(*sizes) if backward else None
        self.forward_inputs, self.backward_inputs = blocks.llama_forward_inputs, blocks.llama_backward_inputs
        self.flops = block_flops(b, s, e, kv_heads * hd, ffn, 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", choices=["gpt", "llama"], default="gpt")
    parser.add_argument("--form", choices=["tp", "sp"], default="tp")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8, help="key/value heads (--block llama)")
    parser.add_argument("--ffn", type=int, default=14336, help="MLP hidden features (--block llama)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="torch.profiler kernel classes per impl")
    parser.add_argument("--memory", action="store_true",
                        help="what is live at each training step's peak memory (allocator trace)")
    parser.add_argument("--segments", action="store_true",
                        help="meshfuser's own profile: the slowest segments that are not GEMMs or attention")
    args = parser.parse_args()

    d, rank, device, dtype = rank_setup()
    cuda = device.type == "cuda"
    b, s, e, h, kvh, ffn = args.batch, args.seq, args.hidden, args.heads, args.kv_heads, args.ffn
    if not cuda:  # CPU: a smoke run of the same code
        s, e, h, kvh, ffn = min(s, 64), min(e, 64), min(h, 4), min(kvh, 2), min(ffn, 96)
    hd = e // h
    assert h % d == 0 and s % d == 0, "heads and sequence must split evenly over the ranks"
    assert args.block == "gpt" or (h % kvh == 0 and kvh % d == 0), \
        "--kv-heads must divide --heads and split evenly over the ranks"
    group = dist.group.WORLD if d > 1 else None

    block = Block(args.block, b, s, h, hd, d, args.form, dtype, kvh, ffn, not args.no_backward)
    local = {n: t.to(device) for n, t in block.shard(block.full, args.form, d, rank).items()}
    x = local.pop("x")
    flops = block.flops
    rows = []

    # meshfuser: the forward alone, and the step (the forward saving activations, then the backward)
    fwd, train_fwd, bwd = block.forward, block.training_forward, block.backward
    mf_inputs = block.forward_inputs(x, local)

    def mf_forward():
        return fwd.execute(mf_inputs)

    def mf_step():
        # As autograd runs a compiled backward: the saved activations belong to the backward, which
        # frees each after its last use (release_inputs); the block output stays with the caller.
        outs = train_fwd.execute(mf_inputs)
        out = outs[0]
        inputs = block.backward_inputs(torch.ones_like(out), outs, x, local)
        del outs
        return bwd.execute(inputs, release_inputs=True)

    # PyTorch eager and compiled, with autograd for the backward (the RoPE tables are constants).
    params = {n: t.detach().clone().requires_grad_(n not in ("cos", "sin")) for n, t in local.items()}
    x_req = x.detach().clone().requires_grad_(True)
    eager = lambda: block.torch_fn(params, x_req, hd, args.form, group, d)  # noqa: E731
    compiled_fn = None if args.no_compile else torch.compile(block.torch_fn, dynamic=False)
    compiled = None if compiled_fn is None else (lambda: compiled_fn(params, x_req, hd, args.form, group, d))

    def step(fn):
        return training_step(fn, torch.ones_like, [x_req, *params.values()])

    # The results agree before anything is timed.
    with torch.no_grad():
        ref = eager()
    got = mf_forward()[0]
    err = (got.float() - ref.float()).abs().max().item()
    tol = 0.1 if dtype == torch.bfloat16 else 1e-3
    assert err < tol * max(1.0, ref.float().abs().max().item()), f"meshfuser forward differs from eager by {err}"

    impls = {"meshfuser": (mf_forward, None if bwd is None else mf_step),
             "eager": (eager, None if args.no_backward else step(eager))}
    if compiled is not None:
        impls["torch.compile"] = (compiled, None if args.no_backward else step(compiled))
    # Times in turns (time_interleaved_ms): the implementations share the GPU's state over the run.
    with torch.no_grad():
        fwd_ms = time_interleaved_ms({n: f for n, (f, _) in impls.items()}, warmup=3, iters=args.iters)
    step_ms = time_interleaved_ms({n: st for n, (_, st) in impls.items() if st is not None}, warmup=3,
                                  iters=args.iters)
    for name, (fwd_fn, step_fn) in impls.items():
        row = {"impl": name, "fwd_ms": fwd_ms[name]}
        # Peaks are absolute (parameters and inputs included): the gradients autograd left from the
        # timed steps go first, so that each implementation starts from the same memory.
        for t in [x_req, *params.values()]:
            t.grad = None
        with torch.no_grad():
            row["fwd_peak_gib"] = peak_gib(fwd_fn)
            row["fwd_host_ms"] = host_ms(fwd_fn)
        if step_fn is not None:
            row["fwd_bwd_ms"] = step_ms[name]
            row["fwd_bwd_peak_gib"] = peak_gib(step_fn)
            row["fwd_bwd_host_ms"] = host_ms(step_fn)
        row["fwd_tflops"] = flops / d / (row["fwd_ms"] * 1e-3) / 1e12
        if "fwd_bwd_ms" in row:
            row["fwd_bwd_tflops"] = 3 * flops / d / (row["fwd_bwd_ms"] * 1e-3) / 1e12
        rows.append(row)

    base = {r["impl"]: r for r in rows}
    for r in rows:
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if key in r and "eager" in base and key in base["eager"]:
                r[f"{key[:-3]}_vs_eager"] = base["eager"][key] / r[key]
            if key in r and "torch.compile" in base and key in base["torch.compile"]:
                r[f"{key[:-3]}_vs_compile"] = base["torch.compile"][key] / r[key]
    if args.breakdown and not cuda and rank == 0:
        print("--breakdown reads the GPU's kernel timeline: skipped on CPU")
    if args.breakdown and cuda:
        from kernel_breakdown import breakdowns_in_both_orders, print_breakdown
        with torch.no_grad():
            fwd_parts = breakdowns_in_both_orders({name: f for name, (f, _) in impls.items()})
        step_parts = {} if args.no_backward else breakdowns_in_both_orders({name: st for name, (_, st) in impls.items()})
        if rank == 0:
            print_breakdown(f"{block.title} forward", fwd_parts)
            if step_parts:
                print_breakdown(f"{block.title} forward+backward", step_parts)
    if args.memory and cuda and rank == 0:
        from memory_timeline import print_peak
        print_peak(f"{block.title} meshfuser training step", mf_step)
        if compiled is not None:
            print_peak(f"{block.title} torch.compile training step", step(compiled))
    if args.segments and rank == 0:
        outs = train_fwd.execute(mf_inputs)
        print_slowest_segments(f"{block.title} training forward", train_fwd, lambda: train_fwd.execute(mf_inputs))
        if bwd is not None:
            bwd_inputs = block.backward_inputs(torch.ones_like(outs[0]), outs, x, local)
            print_slowest_segments(f"{block.title} backward", bwd, lambda: bwd.execute(bwd_inputs))
    if rank == 0:
        title = (f"{block.title}, {args.form.upper()} on {d} rank(s) ({device.type}), b={b} s={s} e={e} "
                 f"heads={h}, {str(dtype).split('.')[-1]} (ratios: above 1 means meshfuser is faster)")
        columns = ["impl", "fwd_ms", "fwd_tflops", "fwd_peak_gib", "fwd_host_ms", "fwd_vs_eager", "fwd_vs_compile", "fwd_bwd_ms",
                   "fwd_bwd_tflops", "fwd_bwd_peak_gib", "fwd_bwd_host_ms", "fwd_bwd_vs_eager", "fwd_bwd_vs_compile"]
        print_table(title, rows, columns)
        write_json(f"transformer_block_{args.block}_{args.form}_{d}.json", {"args": vars(args), "rows": rows})


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
