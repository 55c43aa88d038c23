"""What is live at a function's peak GPU memory, from the CUDA caching allocator's own trace
(torch.cuda.memory._record_memory_history): the peak above what was allocated before the call,
and every allocation live at that moment with its size and where it was made (the first
meshfuser and ATen frames of a C++ stack, or the last Python frame of a compiled graph).

    from memory_timeline import print_peak
    print_peak("meshfuser step", step)

Used by `transformer_block.py --memory`: peak memory is a goal beside time, and a peak cannot be
lowered before it is known which tensors make it.
"""
import torch


def _label(frames):
    """A short name for where an allocation was made: meshfuser's frame and the ATen op under it,
    else the innermost Python frame outside torch's own packages."""
    mf = next((f["name"] for f in frames if f["name"].startswith("mf::")), None)
    op = next((f["name"] for f in frames if f["name"].startswith(("at::native::", "at::_ops::"))
               and "empty" not in f["name"]), None)
    if mf or op:
        return " / ".join(n.split("(")[0][:70] for n in (mf, op) if n)
    py = [f for f in frames if f["filename"].endswith(".py") and "/torch/" not in f["filename"]]
    if py:
        f = py[0]
        return f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"[:100]
    return (frames[0]["name"][:80] if frames else "?")


def peak_timeline(fn):
    """(bytes allocated before fn, peak above that, [(size, label)] live at the peak, index of the
    peak among the allocator's actions, number of actions). fn's result is dropped before the
    trace is read."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(context="alloc", stacks="all", max_entries=1_000_000)
    try:
        result = fn()
        torch.cuda.synchronize()
        del result
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    live, current, peak, at_peak, peak_index = {}, 0, 0, {}, 0
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, at_peak, peak_index = current, dict(live), i
        elif event["action"] == "free_requested" and event["addr"] in live:
            current -= live.pop(event["addr"])["size"]
    rows = sorted(((e["size"], _label(e.get("frames", []))) for e in at_peak.values()), reverse=True)
    return base, peak, rows, peak_index, len(trace)


def print_peak(title, fn, smallest_mib=1.0):
    base, peak, rows, index, actions = peak_timeline(fn)
    print(f"\n{title}: allocated before {base / 2**30:.3f} GiB, peak +{peak / 2**30:.3f} GiB "
          f"(action {index} of {actions}); live at the peak, {len(rows)} allocations:")
    grouped = {}
    for size, label in rows:
        if size >= smallest_mib * 2**20:
            key = (size, label)
            grouped[key] = grouped.get(key, 0) + 1
    small = sum(size for size, _ in rows if size < smallest_mib * 2**20)
    for (size, label), count in sorted(grouped.items(), key=lambda kv: -kv[0][0] * kv[1]):
        print(f"  {count:3d} x {size / 2**20:9.1f} MiB  {label}")
    print(f"  and {small / 2**20:.1f} MiB in allocations under {smallest_mib} MiB")
