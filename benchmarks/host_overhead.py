"""Host overhead of a cached execute(): a one-op fusion on small CPU tensors against the same
ATen call made directly. Prints the overhead in microseconds per call."""
import time

import torch

import meshfuser
from meshfuser import FusionDefinition
from common import print_table, write_json


def per_call_us(fn, iters):
    for _ in range(1000):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, y))
    inputs = [a, b]
    torch.testing.assert_close(fd.execute(inputs)[0], a + b)
    iters = 20000
    eager = per_call_us(lambda: torch.add(a, b), iters)
    mf = per_call_us(lambda: fd.execute(inputs), iters)
    rows = [{"what": "torch.add", "us_per_call": eager}, {"what": "fd.execute (cached)", "us_per_call": mf},
            {"what": "overhead", "us_per_call": mf - eager}]
    print_table("host overhead of a cached execute() (CPU, 8x8 float add)", rows, ["what", "us_per_call"])
    write_json("host_overhead.json", {"eager_us": eager, "meshfuser_us": mf, "overhead_us": mf - eager})


if __name__ == "__main__":
    main()
