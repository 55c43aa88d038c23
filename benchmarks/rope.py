"""Llama's RoPE with its neighbours on one GPU: q and k as the q/k projections leave them
([batch, seq, heads * head_dim] bf16), viewed as heads, moved ahead of the sequence and rotated in
the HF rotate_half form (slice, neg, cat, mul, add) with [seq, head_dim] cos/sin tables. meshfuser
(one generated kernel each for q and k, slice and cat computed in place) against PyTorch eager,
torch.compile and a device-to-device copy of the same bytes.

    python benchmarks/rope.py                       # seq 8192, 32 query heads, 8 KV heads, head_dim 128
    python benchmarks/rope.py --seq 4096 --heads 32 --kv-heads 32
"""
import argparse
import sys

import torch

import meshfuser
from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json


def rotary(fd, t, cos, sin, shape):
    b, h, s, hd = shape
    half = hd // 2
    first = fd.ops.slice(t, [0, 0, 0, 0], [b, h, s, half])
    second = fd.ops.slice(t, [0, 0, 0, half], [b, h, s, hd])
    rotated = fd.ops.cat([fd.ops.neg(second), first], 3)
    return fd.ops.cast(fd.ops.add(fd.ops.mul(t, cos), fd.ops.mul(rotated, sin)), DataType.BFloat16)


def definition(b, s, hq, hkv, hd):
    with FusionDefinition() as fd:
        q = fd.define_tensor([b, s, hq * hd], dtype=DataType.BFloat16)
        k = fd.define_tensor([b, s, hkv * hd], dtype=DataType.BFloat16)
        cos = fd.define_tensor([s, hd], dtype=DataType.BFloat16)
        sin = fd.define_tensor([s, hd], dtype=DataType.BFloat16)
        for t, h in ((q, hq), (k, hkv)):
            heads = fd.ops.permute(fd.ops.reshape(t, [b, s, h, hd]), [0, 2, 1, 3])
            fd.add_output(rotary(fd, heads, cos, sin, (b, h, s, hd)))
    return fd


def eager(q, k, cos, sin, hq, hkv, hd):
    def rotate_half(t):
        half = t.shape[-1] // 2
        return torch.cat([-t[..., half:], t[..., :half]], dim=-1)

    b, s = q.shape[:2]
    q = q.view(b, s, hq, hd).transpose(1, 2)
    k = k.view(b, s, hkv, hd).transpose(1, 2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("rope.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    b, s, hq, hkv, hd = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    torch.manual_seed(0)
    q = torch.randn(b, s, hq * hd, dtype=torch.bfloat16, device=dev)
    k = torch.randn(b, s, hkv * hd, dtype=torch.bfloat16, device=dev)
    angles = torch.outer(torch.arange(s, dtype=torch.float32), 10000.0 ** (-torch.arange(0, hd, 2) / hd))
    angles = torch.cat([angles, angles], dim=-1).to(dev)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    inputs = [q, k, cos, sin]
    fd = definition(b, s, hq, hkv, hd)

    with meshfuser.Profiler() as prof:
        out_q, out_k = fd.execute(inputs)
    segments = [k.scheduler for k in prof.profile.kernel_profiles]
    ref_q, ref_k = eager(q.float(), k.float(), cos.float(), sin.float(), hq, hkv, hd)
    torch.testing.assert_close(out_q.float(), ref_q, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out_k.float(), ref_k, rtol=2e-2, atol=2e-2)

    def run_eager():
        return eager(q, k, cos, sin, hq, hkv, hd)

    t_mf = time_ms(lambda: fd.execute(inputs))
    t_eager = time_ms(run_eager)
    try:
        compiled = torch.compile(lambda: eager(q, k, cos, sin, hq, hkv, hd))
        compiled()
        t_compile = time_ms(compiled)
    except Exception as e:  # a broken inductor install should not hide the other figures
        print(f"torch.compile failed: {type(e).__name__}: {e}", file=sys.stderr)
        t_compile = float("nan")
    src = torch.cat([q.flatten(), k.flatten()])
    dst = torch.empty_like(src)
    t_copy = time_ms(lambda: dst.copy_(src))
    copy_gbps = 2 * src.numel() * 2 / t_copy / 1e6
    # Each q/k element is read once and written once; the tables are read once.
    bytes_moved = 2 * src.numel() * 2 + 2 * cos.numel() * 2
    rows = [{"impl": n, "ms": t, "GB/s": bytes_moved / t / 1e6, "of_copy_bw": bytes_moved / t / 1e6 / copy_gbps,
             "meshfuser_speedup": t / t_mf}
            for n, t in [("meshfuser", t_mf), ("eager", t_eager), ("torch.compile", t_compile)]]
    rows.append({"impl": "d2d copy", "ms": t_copy, "GB/s": copy_gbps, "of_copy_bw": 1.0})
    title = (f"RoPE (view, permute, rotate_half) q [{b}, {s}, {hq}x{hd}] + k [{b}, {s}, {hkv}x{hd}] bf16, "
             f"{torch.cuda.get_device_name()} (segments: {segments})")
    print_table(title, rows, ["impl", "ms", "GB/s", "of_copy_bw", "meshfuser_speedup"])
    print(f"meshfuser: {segments.count('pointwise')} generated kernels, "
          f"{segments.count('expr_eval')} ATen segments (views)")
    write_json("rope.json", {"device": torch.cuda.get_device_name(), "rows": rows, "segments": segments,
                             "shape": {"batch": b, "seq": s, "heads": hq, "kv_heads": hkv, "head_dim": hd}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
