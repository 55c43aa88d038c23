"""torch.compile(backend="meshfuser") against torch.compile's default (Inductor) and eager on Hugging
Face's LlamaDecoderLayer, forward and forward+backward, in one run; first-call compile times beside
each other.

    python benchmarks/compile_backend.py                    # one GPU: hidden 4096, 32 heads, 8 KV heads,
                                                            # sequence 8192, bf16 (CPU: tiny smoke run)
    python benchmarks/compile_backend.py --seq 2048 --print-partitions
    python benchmarks/compile_backend.py --breakdown        # + where each backend's time goes

The model is built once per backend from the same seed; each backend's first call (compile included)
is timed separately, then calls are timed with CUDA events. --breakdown splits each backend's forward
and forward+backward device time into GEMM, attention, generated kernels (meshfuser's, Inductor's
Triton), other ATen kernels (torch.profiler; on CPU the ATen ops' own time). --print-partitions
prints meshfuser's partitions report and, per program, what its segments run on the GPU path that is
neither a generated kernel nor a view (GEMMs, attention, and ATen ops with the reason)."""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, time_ms, training_step, write_json  # noqa: E402

import meshfuser.dynamo  # noqa: E402  (registers backend="meshfuser")
from meshfuser.testing import llama_decoder_layer  # noqa: E402


def layer_flops(b, s, e, kv, f, causal=True):
    """Forward FLOPs: q/o projections 2*2*s*e^2, k/v 2*2*s*e*kv, MLP 3*2*s*e*f, attention 4*s^2*e
    (halved when causal)."""
    linears = 2 * b * s * (2 * e * e + 2 * e * kv + 3 * e * f)
    return linears + 4 * b * s * s * e * (0.5 if causal else 1.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--backends", default="eager,inductor,meshfuser",
                        help="also: meshfuser-saved (options={'recompute': False}: no recomputation in the backward)")
    parser.add_argument("--print-partitions", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="kernel classes per backend (torch.profiler)")
    args = parser.parse_args()

    from transformers import LlamaConfig
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    s, e, h, kv, f = args.seq, args.hidden, args.heads, args.kv_heads, args.intermediate
    if not cuda:  # a smoke run of the same code
        s, e, h, kv, f = 64, 64, 4, 2, 128
    config = LlamaConfig(hidden_size=e, intermediate_size=f, num_attention_heads=h, num_key_value_heads=kv,
                         num_hidden_layers=1, torch_dtype=dtype)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    base = llama_decoder_layer(config).to(device=device, dtype=dtype)
    x = torch.randn(1, s, e, device=device, dtype=dtype)
    dy = torch.randn(1, s, e, device=device, dtype=dtype)
    flops = layer_flops(1, s, e, e // h * kv, f)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    rows, outputs, parts = [], {}, {"forward": {}, "forward+backward": {}}
    for name in args.backends.split(","):
        try:
            rows.append(run_backend(name, base, x, dy, flops, sync, args, outputs, parts))
        except Exception as e:  # report and go on with the other backends
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    summarize(rows, outputs, args, dtype, s, e, h, kv, f, cuda)
    if args.breakdown:
        from kernel_breakdown import print_breakdown
        for what, named in parts.items():
            print_breakdown(f"LlamaDecoderLayer {what}" + ("" if cuda else " (CPU smoke run: ATen ops' CPU time)"),
                            named)


def print_partitions():
    """The partitions report, and each program's GPU plan beyond generated kernels and views."""
    from meshfuser.dynamo.gpu_plan import describe
    for report in meshfuser.dynamo.reports():
        print(report)
        for program in report.programs:
            if hasattr(program, "fd") and program.mesh is None:
                print(f"  {program.name} on the GPU path (besides generated kernels and views):")
                print("\n".join(describe(program)) or "    nothing")


def run_backend(name, base, x, dy, flops, sync, args, outputs, parts):
    """One backend: first calls (compile included) timed, then steady-state forward and fwd+bwd."""
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    model = copy.deepcopy(base)
    if name == "eager":
        fn = model
    elif name == "meshfuser-saved":  # the default partitioner: every intermediate the backward reads saved
        fn = torch.compile(model, backend="meshfuser", dynamic=False, options={"recompute": False})
    else:
        fn = torch.compile(model, backend=name, dynamic=False)
    xi = x.clone().requires_grad_()
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(xi)
    sync()
    compile_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn(xi).backward(dy)
    sync()
    compile_train = time.perf_counter() - t0
    with torch.no_grad():
        fwd_ms = time_ms(lambda: fn(xi), iters=args.iters)
        outputs[name] = fn(xi).float()

    step = training_step(lambda: fn(xi), dy, [xi, *model.parameters()])
    train_ms = time_ms(step, iters=args.iters)
    if args.breakdown:
        from kernel_breakdown import breakdown_ms

        def forward():
            with torch.no_grad():
                fn(xi)
        parts["forward"][name] = breakdown_ms(forward)
        parts["forward+backward"][name] = breakdown_ms(step)
    if name.startswith("meshfuser") and args.print_partitions:
        print_partitions()
    return {"backend": name, "forward ms": fwd_ms, "fwd+bwd ms": train_ms,
            "fwd TFLOP/s": flops / fwd_ms / 1e9, "fwd+bwd TFLOP/s": 3 * flops / train_ms / 1e9,
            "first call s (no_grad)": compile_fwd, "first call s (train)": compile_train}


def summarize(rows, outputs, args, dtype, s, e, h, kv, f, cuda):
    by = {r["backend"]: r for r in rows}
    for r in rows:
        for other in ("eager", "inductor"):
            if other in by and r["backend"] != other:
                r[f"fwd x vs {other}"] = by[other]["forward ms"] / r["forward ms"]
                r[f"fwd+bwd x vs {other}"] = by[other]["fwd+bwd ms"] / r["fwd+bwd ms"]
    if "eager" in outputs:
        for name, out in outputs.items():
            err = (out - outputs["eager"]).abs().max().item()
            by[name]["max |out - eager|"] = err
    columns = ["backend", "forward ms", "fwd+bwd ms", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "fwd x vs inductor",
               "fwd+bwd x vs inductor", "fwd x vs eager", "first call s (no_grad)", "first call s (train)",
               "max |out - eager|"]
    title = (f"LlamaDecoderLayer, {dtype}, hidden {e}, {h} heads, {kv} KV heads, sequence {s}, MLP {f} "
             f"({'GPU ' + torch.cuda.get_device_name() if cuda else 'CPU smoke run'})")
    print_table(title, rows, columns)
    write_json("compile_backend.json", {"config": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
