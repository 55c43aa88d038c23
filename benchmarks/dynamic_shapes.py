"""What a new extent costs on a warm definition: meshfuser (shape classes: one program per class,
kernel text independent of the row count) against torch.compile (default dynamic=None: it marks an
axis dynamic after the second shape), in one run. Each case is called with 2 warm-up shapes, then
with N new row counts; a new shape's cost is its first call minus a repeated call of that shape.

    python benchmarks/dynamic_shapes.py [--lengths 24] [--cases layer_norm_gelu,pointwise,...]

Prints per case the median and max cost per new shape, the compile work meshfuser did over the new
shapes (executors built, new kernel sources), and writes dynamic_shapes.json."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import transformer_blocks as blocks  # noqa: E402
from transformer_block import torch_block  # noqa: E402

BF = DataType.BFloat16
HIDDEN = 4096
EPS = 1e-5


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _wall_ms(fn, dev):
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return (time.perf_counter() - t0) * 1e3


def _layer_norm_gelu(fd):
    x = fd.ops.cast(fd.define_tensor([-1, HIDDEN], dtype=BF), DataType.Float)
    w = fd.ops.cast(fd.define_tensor([HIDDEN], dtype=BF), DataType.Float)
    b = fd.ops.cast(fd.define_tensor([HIDDEN], dtype=BF), DataType.Float)
    var, mean = fd.ops.var_mean(x, [1], correction=0, keepdim=True)
    y = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, EPS)))
    fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.add(fd.ops.mul(y, w), b)), BF))


def _pointwise(fd):
    x = fd.define_tensor([-1, HIDDEN], dtype=BF)
    b = fd.define_tensor([HIDDEN], dtype=BF)
    fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.cast(b, DataType.Float))), BF))


def _reduction(fd):
    fd.add_output(fd.ops.sum(fd.ops.cast(fd.define_tensor([-1, HIDDEN], dtype=BF), DataType.Float), [1]))


def cases(dev, heads, head_dim):
    """name -> (define(fd), inputs(rows), torch function)."""
    vec = lambda: torch.randn(HIDDEN, device=dev, dtype=torch.bfloat16)  # noqa: E731
    w, b = vec(), vec()
    mat = lambda rows: torch.randn(rows, HIDDEN, device=dev, dtype=torch.bfloat16)  # noqa: E731
    out = {
        "layer_norm_gelu": (_layer_norm_gelu, lambda r: [mat(r), w, b],
                            lambda x, w, b: F.gelu(F.layer_norm(x.float(), [HIDDEN], w.float(), b.float(), EPS)).to(x.dtype)),
        "pointwise": (_pointwise, lambda r: [mat(r), b], lambda x, b: F.gelu(x.float() + b.float()).to(x.dtype)),
        "reduction": (_reduction, lambda r: [mat(r)], lambda x: x.float().sum(1)),
    }
    e = heads * head_dim
    params = {n: t.to(dev) for n, t in blocks.gpt_parameters(1, 8, e, seed=0, dtype=torch.bfloat16).items()}
    params.pop("x")

    def gpt_define(fd):
        blocks.define_gpt_forward(fd, 1, -1, heads, head_dim, BF)

    def gpt_inputs(rows):
        return blocks.gpt_forward_inputs(torch.randn(1, rows, e, device=dev, dtype=torch.bfloat16) * 0.5, params)

    def gpt_torch(x, *rest):
        return torch_block(params, x, head_dim, "tp", None, 1)

    out["gpt_block_forward"] = (gpt_define, gpt_inputs, gpt_torch)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, default=24, help="new row counts per case, after 2 warm-up ones")
    parser.add_argument("--cases", default="layer_norm_gelu,pointwise,reduction,gpt_block_forward")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":  # a smoke run: tiny shapes
        args.heads, args.head_dim = 2, 8
    table = []
    all_cases = cases(dev, args.heads, args.head_dim)
    for name in args.cases.split(","):
        define, make_inputs, torch_fn = all_cases[name]
        big = name != "gpt_block_forward"
        lengths = [(1000 if big else 512) + 248 * k + 8 * (k % 3) for k in range(args.lengths + 2)]
        meshfuser._C.clear_caches()
        with FusionDefinition() as fd:
            define(fd)
        torch._dynamo.reset()
        compiled = torch.compile(torch_fn)
        costs = {"meshfuser": [], "compile": []}
        counters = None
        for i, rows in enumerate(lengths):
            torch.manual_seed(i)
            ins = make_inputs(rows)
            if i == 2:
                counters = meshfuser.compile_counters()
            for impl, fn in (("meshfuser", lambda: fd.execute(ins)), ("compile", lambda: compiled(*ins))):
                first = _wall_ms(fn, dev)
                again = min(_wall_ms(fn, dev) for _ in range(3))
                if i >= 2:
                    costs[impl].append(max(0.0, first - again))
            if i == 0:  # the results agree
                ref = torch_fn(*ins)
                got = fd.execute(ins)[0]
                torch.testing.assert_close(got.float(), ref.float(), rtol=5e-2, atol=5e-2)
        after = meshfuser.compile_counters()
        row = {"case": name, "new_shapes": len(costs["meshfuser"]),
               "mf_ms_per_new_shape": statistics.median(costs["meshfuser"]), "mf_max_ms": max(costs["meshfuser"]),
               "compile_ms_per_new_shape": statistics.median(costs["compile"]), "compile_max_ms": max(costs["compile"]),
               "mf_executors_built": after["executors"] - counters["executors"],
               "mf_new_sources": after["sources"] - counters["sources"]}
        row["compile_over_mf"] = row["compile_ms_per_new_shape"] / max(row["mf_ms_per_new_shape"], 1e-6)
        table.append(row)
        print(row, flush=True)
    print_table(f"cost of a new row count on a warm definition ({dev.type}, bf16, hidden {HIDDEN}; GPT block: "
                f"{args.heads} heads x {args.head_dim})", table,
                ["case", "new_shapes", "mf_ms_per_new_shape", "mf_max_ms", "compile_ms_per_new_shape",
                 "compile_max_ms", "compile_over_mf", "mf_executors_built", "mf_new_sources"])
    write_json("dynamic_shapes.json", {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                                       "rows": table})


if __name__ == "__main__":
    main()
