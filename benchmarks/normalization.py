"""Normalizations and a transposed add, bf16 in/out with float compute, on one GPU: meshfuser's
generated kernels against PyTorch eager, torch.compile(dynamic=False) and a device-to-device copy
of the same number of bytes, in the same run. Prints a table (fraction of copy bandwidth, ratios)
and writes normalization.json.

    python benchmarks/normalization.py [--shapes 32768x4096,8192x16384,262144x256] [--patterns softmax,...]
"""
import argparse
import os
import sys

import torch

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import norm_patterns  # noqa: E402

PATTERNS = ["softmax", "rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward", "transposed_add"]


def eager(name, cols):
    """PyTorch's own kernels where it has them, else the formula op by op."""
    eps = norm_patterns.EPS
    if name == "softmax":
        return lambda x: [torch.softmax(x, -1)]
    if name == "layer_norm":
        return lambda x, w, b: list(torch.native_layer_norm(x, (cols,), w, b, eps))
    if name == "transposed_add":
        return lambda x, y: [x.t() + y]
    return lambda *ins: norm_patterns.torch_reference(name, list(ins), torch.bfloat16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="32768x4096,8192x16384,262144x256")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    rows_out = []
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        for name in args.patterns.split(","):
            torch.manual_seed(0)
            inputs = norm_patterns.make_inputs(name, dtype, rows, cols, device=dev)
            with FusionDefinition() as fd:
                getattr(norm_patterns, name)(fd, DataType.BFloat16, rows, cols)
            with meshfuser.Profiler() as prof:
                out = fd.execute(inputs)
            segments = [k.scheduler for k in prof.profile.kernel_profiles]
            ref = norm_patterns.torch_reference(name, inputs, dtype)
            for o, r in zip(out, ref):
                torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-2)
            nbytes = sum(t.numel() * t.element_size() for t in inputs) + sum(o.numel() * o.element_size() for o in out)
            src = torch.empty(nbytes // 4, dtype=torch.int16, device=dev)
            dst = torch.empty_like(src)
            t_copy = time_ms(lambda: dst.copy_(src))  # reads and writes nbytes in all
            copy_gbps = nbytes / t_copy / 1e6
            t_mf = time_ms(lambda: fd.execute(inputs))
            eager_fn = eager(name, cols)
            t_eager = time_ms(lambda: eager_fn(*inputs))
            t_compile = float("nan")
            if not args.no_compile:
                ref_fn = lambda *ins: norm_patterns.torch_reference(name, list(ins), dtype)  # noqa: E731
                # One lambda serves every case: without a reset, dynamo's per-code recompile limit
                # (8) silently falls back to eager for the later cases.
                torch._dynamo.reset()
                compiled = torch.compile(ref_fn, dynamic=False)
                compiled(*inputs)
                t_compile = time_ms(lambda: compiled(*inputs))
            frac = lambda t: nbytes / t / 1e6 / copy_gbps  # noqa: E731
            rows_out.append({"shape": shape, "fusion": name, "meshfuser_ms": t_mf, "mf_of_copy": frac(t_mf),
                             "eager_of_copy": frac(t_eager), "compile_of_copy": frac(t_compile),
                             "eager_over_mf": t_eager / t_mf, "compile_over_mf": t_compile / t_mf,
                             "copy_GBps": copy_gbps, "segments": ",".join(segments)})
            del inputs, out, src, dst
            torch.cuda.empty_cache()
    print_table(f"normalizations, bf16 in/out, float compute, {torch.cuda.get_device_name()} "
                "(x_of_copy: bandwidth as a fraction of a d2d copy of the same bytes; y_over_mf > 1: meshfuser faster)",
                rows_out, ["shape", "fusion", "meshfuser_ms", "mf_of_copy", "eager_of_copy", "compile_of_copy",
                           "eager_over_mf", "compile_over_mf", "segments"])
    write_json("normalization.json", {"device": torch.cuda.get_device_name(), "rows": rows_out})


if __name__ == "__main__":
    main()
