"""sum(x, -1) and sum(x, 0) of a [16384, 16384] bf16 tensor into float on one GPU: meshfuser's
generated kernels against torch.sum, and bandwidth against a device-to-device copy. Then the GPT
block's backward column sums (bias gradients: sum over the tokens of [8192, 16384] and
[8192, 4096] bf16 into bf16, float accumulation) and a LayerNorm's weight and bias gradients (two
column sums in one kernel) against eager and torch.compile, with the
generated kernel's device time (meshfuser.Profiler) beside the end-to-end call time.

    python benchmarks/reduction.py [--gpt-only]
"""
import argparse
import statistics

import torch

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json

GPT_COLUMN_SUMS = [(8192, 16384), (8192, 4096)]  # the MLP and attention/LN widths of the GPT block


def square_sums(copy_gbps, rows):
    n = 16384
    x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for axis in (-1, 0):
        with FusionDefinition() as fd:
            t = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
            fd.add_output(fd.ops.sum(t, [axis], dtype=DataType.Float))
        with meshfuser.Profiler() as prof:
            out = fd.execute([x])[0]
        schedulers = [k.scheduler for k in prof.profile.kernel_profiles]
        torch.testing.assert_close(out, x.float().sum(axis), rtol=1e-3, atol=1e-2)
        t_mf = time_ms(lambda: fd.execute([x]))
        t_torch = time_ms(lambda: torch.sum(x, axis, dtype=torch.float32))
        bytes_moved = x.numel() * 2 + n * 4
        for impl, tm in [("meshfuser", t_mf), ("torch.sum", t_torch)]:
            rows.append({"reduction": f"sum(x, {axis}) [{n}, {n}]", "impl": impl, "ms": tm,
                         "GB/s": bytes_moved / tm / 1e6, "of_copy_bw": bytes_moved / tm / 1e6 / copy_gbps,
                         "torch_over_meshfuser": t_torch / t_mf, "segments": ",".join(schedulers)})


def kernel_ms(fd, inputs, runs=20):
    """Median device time of the generated kernels of one call (Profiler events)."""
    samples = []
    for _ in range(runs):
        with meshfuser.Profiler() as prof:
            fd.execute(inputs)
        samples.append(sum(k.time_ms for k in prof.profile.kernel_profiles))
    return statistics.median(samples)


def gpt_column_sums(copy_gbps, rows):
    for r, c in GPT_COLUMN_SUMS:
        x = torch.randn(r, c, dtype=torch.bfloat16, device="cuda")
        with FusionDefinition() as fd:
            t = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
            fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.cast(t, DataType.Float), [0]), DataType.BFloat16))
        with meshfuser.Profiler() as prof:
            out = fd.execute([x])[0]
        schedulers = [k.scheduler for k in prof.profile.kernel_profiles]
        torch.testing.assert_close(out.float(), x.float().sum(0), rtol=2e-2, atol=0.5)
        eager = lambda: torch.sum(x, 0)  # noqa: E731 (bf16 out, float accumulation)
        compiled = torch.compile(lambda a: a.float().sum(0).to(torch.bfloat16), dynamic=False)
        compiled(x)
        timings = [("meshfuser kernel", kernel_ms(fd, [x])), ("meshfuser call", time_ms(lambda: fd.execute([x]))),
                   ("eager", time_ms(eager)), ("torch.compile", time_ms(lambda: compiled(x)))]
        bytes_moved = x.numel() * 2 + c * 2
        for impl, tm in timings:
            rows.append({"reduction": f"sum(x, 0) [{r}, {c}] -> bf16", "impl": impl, "ms": tm,
                         "GB/s": bytes_moved / tm / 1e6, "of_copy_bw": bytes_moved / tm / 1e6 / copy_gbps,
                         "torch_over_meshfuser": timings[3][1] / tm, "segments": ",".join(schedulers)})


def layer_norm_weight_gradients(copy_gbps, rows, r=8192, c=4096):
    """A LayerNorm backward's weight and bias gradients (sum(dy * xhat, 0), sum(dy, 0), xhat from the
    bf16 x and the per-row statistics) in one generated kernel, against eager and torch.compile."""
    dy, x = (torch.randn(r, c, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    mean, rstd = torch.randn(r, 1, device="cuda"), torch.rand(r, 1, device="cuda") + 0.5
    with FusionDefinition() as fd:
        t_dy, t_x = (fd.define_tensor([-1, -1], dtype=DataType.BFloat16) for _ in range(2))
        t_mean, t_rstd = (fd.define_tensor([-1, 1], dtype=DataType.Float) for _ in range(2))
        dyf = fd.ops.cast(t_dy, DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(t_x, DataType.Float), t_mean), t_rstd)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), DataType.BFloat16))
    inputs = [dy, x, mean, rstd]
    with meshfuser.Profiler() as prof:
        dw, db = fd.execute(inputs)
    schedulers = [k.scheduler for k in prof.profile.kernel_profiles]

    def eager(dy, x, mean, rstd):
        dyf = dy.float()
        return (dyf * ((x.float() - mean) * rstd)).sum(0).to(torch.bfloat16), dyf.sum(0).to(torch.bfloat16)
    ref_dw, ref_db = eager(*inputs)
    torch.testing.assert_close(dw.float(), ref_dw.float(), rtol=2e-2, atol=1.0)
    torch.testing.assert_close(db.float(), ref_db.float(), rtol=2e-2, atol=1.0)
    compiled = torch.compile(eager, dynamic=False)
    compiled(*inputs)
    timings = [("meshfuser kernel", kernel_ms(fd, inputs)), ("meshfuser call", time_ms(lambda: fd.execute(inputs))),
               ("eager", time_ms(lambda: eager(*inputs))), ("torch.compile", time_ms(lambda: compiled(*inputs)))]
    bytes_moved = 2 * dy.numel() * 2 + 2 * r * 4 + 2 * c * 2
    for impl, tm in timings:
        rows.append({"reduction": f"LayerNorm dw, db [{r}, {c}] -> bf16", "impl": impl, "ms": tm,
                     "GB/s": bytes_moved / tm / 1e6, "of_copy_bw": bytes_moved / tm / 1e6 / copy_gbps,
                     "torch_over_meshfuser": timings[3][1] / tm, "segments": ",".join(schedulers)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpt-only", action="store_true", help="only the GPT block's column sums")
    args = parser.parse_args()
    x = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(x)
    t_copy = time_ms(lambda: dst.copy_(x))
    copy_gbps = 2 * x.numel() * 2 / t_copy / 1e6
    del x, dst
    rows = []
    if not args.gpt_only:
        square_sums(copy_gbps, rows)
    gpt_column_sums(copy_gbps, rows)
    layer_norm_weight_gradients(copy_gbps, rows)
    print_table(f"reductions of bf16 tensors, {torch.cuda.get_device_name()} (copy {copy_gbps:.0f} GB/s; "
                f"torch_over_meshfuser: torch.compile's time over this row's, for the GPT sums)", rows,
                ["reduction", "impl", "ms", "GB/s", "of_copy_bw", "torch_over_meshfuser", "segments"])
    write_json("reduction.json", {"device": torch.cuda.get_device_name(), "copy_GBps": copy_gbps, "rows": rows})


if __name__ == "__main__":
    main()
