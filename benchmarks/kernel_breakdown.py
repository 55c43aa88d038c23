"""Where a function's GPU time goes, from a torch.profiler kernel table: GEMM, attention, generated
kernels (meshfuser's mf_*, torch.compile's Triton kernels), other ATen kernels, communication.

    from kernel_breakdown import breakdown_ms
    breakdown_ms(fn)  # {"gemm": ..., "attention": ..., "generated": ..., "aten": ..., "comm": ..., "total": ...}

Without a GPU (a smoke run of the same code) it splits the ATen ops' own CPU time the same way
(`cpu=True`): GEMMs, attention and the rest; meshfuser's named ranges are left out.
"""
import torch

CATEGORIES = ["gemm", "attention", "generated", "aten", "comm"]


_CPU_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def classify(kernel_name):
    n = kernel_name.lower()
    if n in _CPU_GEMMS:
        return "gemm"
    if "nccl" in n or n.startswith("gloo") or "c10d::" in n:
        return "comm"
    if any(key in n for key in ("flash", "fmha", "cudnn", "attention", "sdpa", "mha")):
        return "attention"
    if any(key in n for key in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")):
        return "gemm"
    if n.startswith("mf_") or n.startswith("triton") or "triton_" in n:
        return "generated"
    return "aten"


def breakdown_ms(fn, iters=3, cpu=None):
    """Mean device milliseconds per call of fn() by category, and the kernel count per call
    (cpu=True, the default without CUDA: ATen ops' self CPU time, and ops per call)."""
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    fn()
    sync()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([] if cpu else [torch.profiler.ProfilerActivity.CUDA])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        sync()
    totals = dict.fromkeys(CATEGORIES, 0.0)
    launches = 0
    intervals = []
    top = {}
    wanted = torch.autograd.DeviceType.CPU if cpu else torch.autograd.DeviceType.CUDA
    by_class = {c: {} for c in CATEGORIES}
    for evt in prof.events():
        if evt.device_type != wanted:
            continue
        # Named ranges (meshfuser::segment ..., record_function) are mirrored on the GPU timeline
        # around the kernels they contain: counting them would count those kernels twice.
        if getattr(evt, "is_user_annotation", False) or evt.name.startswith("meshfuser::"):
            continue
        if cpu and not evt.name.startswith("aten::"):
            continue
        us = evt.self_cpu_time_total if cpu else (evt.device_time if hasattr(evt, "device_time") else evt.cuda_time)
        cat = classify(evt.name)
        if not cpu:
            intervals.append((evt.time_range.start, evt.time_range.end, evt.name))
        totals[cat] += us / 1e3 / iters
        launches += 1
        top[evt.name] = top.get(evt.name, 0.0) + us / 1e3 / iters
        by_class[cat][evt.name] = by_class[cat].get(evt.name, 0.0) + us / 1e3 / iters
    totals["total"] = sum(totals[c] for c in CATEGORIES)
    # Idle GPU time inside the calls: the span from the first kernel's start to the last one's end,
    # less the time some kernel ran (host-bound stretches, synchronizations, launch latency).
    idle_us, gaps = _idle_us(intervals) if intervals else (0.0, [])
    totals["idle"] = idle_us / 1e3 / iters
    totals["gaps"] = gaps[:6]
    totals["launches"] = launches / iters
    totals["top"] = sorted(top.items(), key=lambda kv: -kv[1])[:8]
    # The small kernels are where fusion choices differ: the largest of each memory-bound class.
    for cat in ("generated", "aten"):
        totals[f"top {cat}"] = sorted(by_class[cat].items(), key=lambda kv: -kv[1])[:6]
    return totals


def breakdowns_in_both_orders(fns):
    """{name: breakdown_ms(fn)} for the named functions, each profiled twice, once in the given
    order and once in reverse, the class totals averaged (the kernel lists are the first pass's).
    In one pass in a fixed order the same cuBLAS and cuDNN kernels took 3-5% longer in the
    profile of meshfuser's GPT training step, which ran first (H200), than in the others: both
    orders tell an effect of the order from one of the implementation."""
    first = {name: breakdown_ms(fn) for name, fn in fns.items()}
    second = {name: breakdown_ms(fns[name]) for name in reversed(list(fns))}
    for name, b in first.items():
        for key in CATEGORIES + ["total", "idle", "launches"]:
            b[key] = (b[key] + second[name][key]) / 2
    return first


def _idle_us(intervals):
    """Total idle microseconds, and the largest gaps as (us, kernel before, kernel after)."""
    intervals.sort()
    idle, end, last, gaps = 0.0, intervals[0][1], intervals[0][2], []
    for start, stop, name in intervals[1:]:
        if start > end:
            idle += start - end
            gaps.append((start - end, last, name))
        if stop >= end:
            end, last = stop, name
    gaps.sort(key=lambda g: -g[0])
    return idle, gaps


def print_breakdown(title, named):
    """named: {impl: breakdown_ms(...)}"""
    print(f"\n{title} (device ms per call by kernel class, torch.profiler)")
    cols = CATEGORIES + ["total", "idle", "launches"]
    print("impl".ljust(16) + "".join(c.rjust(11) for c in cols))
    for impl, b in named.items():
        print(impl.ljust(16) + "".join(f"{b[c]:11.3f}" for c in cols))
    for impl, b in named.items():
        print(f"  {impl} top kernels: " + "; ".join(f"{name[:60]} {ms:.3f}" for name, ms in b["top"]))
        if b.get("gaps"):
            print(f"  {impl} largest idle gaps (us, after -> before): " + "; ".join(
                f"{us:.0f} {a[:40]} -> {z[:40]}" for us, a, z in b["gaps"]))
        for cat in ("generated", "aten"):
            if b.get(f"top {cat}"):
                print(f"  {impl} top {cat}: " + "; ".join(f"{name[:60]} {ms:.3f}" for name, ms in b[f"top {cat}"]))
