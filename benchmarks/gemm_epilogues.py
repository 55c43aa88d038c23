"""Where the work after a GEMM should go: cuBLASLt's epilogue (bias, GELU), the GEMM's own
accumulate (beta = 1 adds the residual), or the generated kernel that reads the GEMM's output
anyway. One H200-sized transformer step per case, bf16, same run, CUDA-event medians:

    python benchmarks/gemm_epilogues.py                 # tokens 8192, hidden 4096 (CPU: a smoke run)

Cases (each row is one way to compute the same result):
  out-proj + bias + residual (GPT):  linear with bias epilogue then add | linear then one add of
                                     bias and residual | meshfuser both ways | torch.compile
  out-proj + residual (Llama):       linear then add | addmm with the residual as C (beta = 1) |
                                     meshfuser | torch.compile
  up-proj + bias + GELU tanh (GPT-2): linear then gelu | cuBLASLt GELU epilogue (_addmm_activation) |
                                     meshfuser | torch.compile
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, time_ms, write_json  # noqa: E402

from meshfuser import DataType, FusionDefinition  # noqa: E402


def _fusion(build, shapes, dtype):
    with FusionDefinition() as fd:
        inputs = [fd.define_tensor(list(s), dtype=dtype) for s in shapes]
        fd.add_output(build(fd, *inputs))
    return fd


def _gelu_tanh(fd, y):
    # 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))
    inner = fd.ops.mul(fd.ops.add(y, fd.ops.mul(fd.ops.mul(fd.ops.mul(y, y), y), 0.044715)), 0.7978845608028654)
    return fd.ops.mul(fd.ops.mul(y, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0))


def cases(t, e, f, device, dtype, mf_dtype):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x, r = rnd(t, e), rnd(t, e)
    w, b = rnd(e, e, scale=e ** -0.5), rnd(e)
    w1, b1 = rnd(f, e, scale=e ** -0.5), rnd(f)

    gpt_mf_epi = _fusion(lambda fd, x, w, b, r: fd.ops.add(fd.ops.linear(x, w, b), r),
                         [(t, e), (e, e), (e,), (t, e)], mf_dtype)
    gpt_mf_kernel = _fusion(lambda fd, x, w, b, r: fd.ops.add(fd.ops.add(fd.ops.linear(x, w), b), r),
                            [(t, e), (e, e), (e,), (t, e)], mf_dtype)
    llama_mf = _fusion(lambda fd, x, w, r: fd.ops.add(fd.ops.linear(x, w), r), [(t, e), (e, e), (t, e)], mf_dtype)
    up_mf = _fusion(lambda fd, x, w, b: _gelu_tanh(fd, fd.ops.linear(x, w, b)), [(t, e), (f, e), (f,)], mf_dtype)

    def gpt_eager():
        return F.linear(x, w, b) + r

    def llama_eager():
        return F.linear(x, w) + r

    def up_eager():
        return F.gelu(F.linear(x, w1, b1), approximate="tanh")

    return {
        "out-proj + bias + residual (GPT)": {
            "eager: bias epilogue, add": gpt_eager,
            "eager: no epilogue, add bias+residual": lambda: F.linear(x, w) + b + r,
            "meshfuser: bias epilogue, generated add": lambda: gpt_mf_epi.execute([x, w, b, r]),
            "meshfuser: bias in generated add": lambda: gpt_mf_kernel.execute([x, w, b, r]),
            "torch.compile": torch.compile(gpt_eager),
            "_reference": gpt_eager,
        },
        "out-proj + residual (Llama)": {
            "eager: linear, add": llama_eager,
            "eager: addmm residual as C (beta=1)": lambda: torch.addmm(r, x, w.t()),
            "meshfuser: generated add": lambda: llama_mf.execute([x, w, r]),
            "torch.compile": torch.compile(llama_eager),
            "_reference": llama_eager,
        },
        "up-proj + bias + GELU tanh (GPT-2)": {
            "eager: bias epilogue, gelu": up_eager,
            "eager: cuBLASLt bias+GELU epilogue": lambda: torch._addmm_activation(b1, x, w1.t(), use_gelu=True),
            "meshfuser: bias epilogue, generated gelu": lambda: up_mf.execute([x, w1, b1]),
            "torch.compile": torch.compile(up_eager),
            "_reference": up_eager,
        },
    }


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) else out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=16384)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype, mf_dtype = (torch.bfloat16, DataType.BFloat16) if cuda else (torch.float32, DataType.Float)
    t, e, f = (args.tokens, args.hidden, args.ffn) if cuda else (64, 32, 128)
    results = {}
    for case, impls in cases(t, e, f, device, dtype, mf_dtype).items():
        reference = impls.pop("_reference")().float()
        rows = []
        for name, fn in impls.items():
            error = (_first(fn()).float() - reference).abs().max().item()
            rows.append({"impl": name, "ms": time_ms(fn, iters=10 if cuda else 3), "max |err|": error})
        best = min(row["ms"] for row in rows)
        for row in rows:
            row["x vs best"] = best / row["ms"]
        print_table(f"{case}: tokens {t}, hidden {e}, ffn {f}, {dtype} ({torch.cuda.get_device_name() if cuda else 'cpu'})",
                    rows, ["impl", "ms", "x vs best", "max |err|"])
        results[case] = rows
    write_json("gemm_epilogues.json", results)


if __name__ == "__main__":
    main()
