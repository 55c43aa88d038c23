"""sum(x, -1) and sum(x, 0) of a [16384, 16384] bf16 tensor into float on one GPU: meshfuser's
generated kernels against torch.sum, and bandwidth against a device-to-device copy."""
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json


def main():
    dev = torch.device("cuda")
    n = 16384
    x = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(x)
    t_copy = time_ms(lambda: dst.copy_(x))
    copy_gbps = 2 * x.numel() * 2 / t_copy / 1e6
    rows = []
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
            rows.append({"reduction": f"sum(x, {axis})", "impl": impl, "ms": tm, "GB/s": bytes_moved / tm / 1e6,
                         "of_copy_bw": bytes_moved / tm / 1e6 / copy_gbps, "torch_over_meshfuser": t_torch / t_mf,
                         "segments": ",".join(schedulers)})
    print_table(f"reductions of [16384, 16384] bf16 into float, {torch.cuda.get_device_name()} "
                f"(copy {copy_gbps:.0f} GB/s)", rows,
                ["reduction", "impl", "ms", "GB/s", "of_copy_bw", "torch_over_meshfuser", "segments"])
    write_json("reduction.json", {"device": torch.cuda.get_device_name(), "copy_GBps": copy_gbps, "rows": rows})


if __name__ == "__main__":
    main()
