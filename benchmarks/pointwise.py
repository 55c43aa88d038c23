"""gelu(x * y + bias) with a broadcast bias over 2^28 bf16 elements on one GPU: meshfuser's
generated kernel against PyTorch eager, torch.compile and a device-to-device copy."""
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json


def main():
    dev = torch.device("cuda")
    rows_n, cols = 2**14, 2**14
    x = torch.randn(rows_n, cols, dtype=torch.bfloat16, device=dev)
    y = torch.randn(rows_n, cols, dtype=torch.bfloat16, device=dev)
    bias = torch.randn(cols, dtype=torch.bfloat16, device=dev)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        ty = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        tb = fd.define_tensor([-1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.add(fd.ops.mul(tx, ty), tb)), DataType.BFloat16))

    def eager(x, y, b):
        return F.gelu(x * y + b)

    compiled = torch.compile(eager)
    ref = eager(x.float(), y.float(), bias.float()).to(torch.bfloat16)
    with meshfuser.Profiler() as prof:
        out = fd.execute([x, y, bias])[0]
    schedulers = [k.scheduler for k in prof.profile.kernel_profiles]
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    dst = torch.empty_like(x)
    t_copy = time_ms(lambda: dst.copy_(x))
    t_mf = time_ms(lambda: fd.execute([x, y, bias]))
    t_eager = time_ms(lambda: eager(x, y, bias))
    t_compile = time_ms(lambda: compiled(x, y, bias))
    bytes_moved = 3 * x.numel() * 2 + bias.numel() * 2
    copy_gbps = 2 * x.numel() * 2 / t_copy / 1e6
    rows = [{"impl": n, "ms": t, "GB/s": bytes_moved / t / 1e6, "of_copy_bw": bytes_moved / t / 1e6 / copy_gbps,
             "meshfuser_speedup": t / t_mf}
            for n, t in [("meshfuser", t_mf), ("eager", t_eager), ("torch.compile", t_compile)]]
    rows.append({"impl": "d2d copy", "ms": t_copy, "GB/s": copy_gbps, "of_copy_bw": 1.0})
    print_table(f"gelu(x*y+bias), 2^28 bf16, {torch.cuda.get_device_name()} (segments: {schedulers})", rows,
                ["impl", "ms", "GB/s", "of_copy_bw", "meshfuser_speedup"])
    write_json("pointwise.json", {"device": torch.cuda.get_device_name(), "rows": rows, "schedulers": schedulers})


if __name__ == "__main__":
    main()
