"""Shared benchmark helpers: timing with CUDA events (or perf_counter on CPU), tables and JSON."""
import json
import os
import statistics
import time

import torch


def rank_setup():
    """(ranks, rank, device, dtype) for a benchmark run alone or under torchrun: this
    rank's GPU in bf16 where there is one, else the CPU in float32 (a smoke run)."""
    import meshfuser
    comm = meshfuser.Communicator.instance()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", comm.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return comm.size(), comm.rank(), device, torch.bfloat16 if cuda else torch.float32


def training_step(forward, grad_out, leaves):
    """A step as an optimizer loop runs it: the gradients of `leaves` set to None first (as
    zero_grad does), so autograd stores each new gradient instead of adding it to the last one;
    meshfuser's backward returns its gradients, and the comparison stays like for like."""
    def run():
        for t in leaves:
            t.grad = None
        out = forward()
        out.backward(grad_out(out) if callable(grad_out) else grad_out)
    return run


def time_ms(fn, warmup=5, iters=20, sync=None, batch=5):
    """Median milliseconds per call of fn(). On GPUs each sample times `batch` back-to-back calls
    between two events (as a training step issues layers), so host work overlaps device work."""
    cuda = torch.cuda.is_available() and sync is None
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        samples = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / batch)
        return statistics.median(samples)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def time_interleaved_ms(fns, warmup=3, iters=10, batch=1):
    """{name: median milliseconds per call} for several implementations of one computation, their
    samples taken in turns (each round starting at the next one), so that a drift of the GPU's clocks
    or temperature over the run falls on all of them alike rather than on whichever ran last."""
    names = list(fns)
    if not (torch.cuda.is_available() and names):
        return {n: time_ms(fns[n], warmup=warmup, iters=iters, batch=batch) for n in names}
    for n in names:
        for _ in range(warmup):
            fns[n]()
    torch.cuda.synchronize()
    samples = {n: [] for n in names}
    for i in range(iters):
        for j in range(len(names)):
            n = names[(i + j) % len(names)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fns[n]()
            end.record()
            torch.cuda.synchronize()
            samples[n].append(start.elapsed_time(end) / batch)
    return {n: statistics.median(v) for n, v in samples.items()}


def host_ms(fn, iters=5):
    """Host milliseconds per call of fn() (the time to issue its work, not to run it): calls issued
    back to back after a synchronization, timed on the CPU. Where it exceeds the device time per
    call, the GPU waits on the host."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return elapsed / iters * 1e3


def print_table(title, rows, columns):
    print(f"\n{title}")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def write_json(name, payload):
    out_dir = os.environ.get("MESHFUSER_BENCH_DIR", os.path.join(os.path.dirname(__file__), "results"))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")
