"""A GPT block forward, sharded over every rank: tensor parallel (TP) or sequence parallel (SP).

    torchrun --nproc_per_node=2 examples/gpt_block.py --form tp
    torchrun --nproc_per_node=2 examples/gpt_block.py --form sp --print-program

LayerNorm -> column-parallel q/k/v -> causal attention on this rank's heads -> row-parallel output
projection -> residual -> LayerNorm -> column-parallel GELU MLP -> row-parallel projection ->
residual. TP keeps activations replicated (two Allreduce); SP splits them on the sequence (an
Allgather before each column-parallel part, a ReduceScatter after each row-parallel linear).
Runs on CPUs (Gloo) or GPUs (NCCL, bfloat16); checks its shard against unsharded PyTorch.
"""
import argparse

import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType

EPS = 1e-5


def layer_norm(fd, x, w, b, e):
    mean = fd.ops.div(fd.ops.sum(x, [2], keepdim=True), float(e))
    centered = fd.ops.sub(x, mean)
    var = fd.ops.div(fd.ops.sum(fd.ops.mul(centered, centered), [2], keepdim=True), float(e))
    normed = fd.ops.mul(centered, fd.ops.rsqrt(fd.ops.add(var, EPS)))
    return fd.ops.add(fd.ops.mul(normed, w), b)


def define_block(fd, shapes, b, s, h, hd, dtype):
    e = h * hd
    t = {n: fd.define_tensor(shape, dtype=dtype) for n, shape in shapes.items()}
    ln0 = layer_norm(fd, t["x"], t["ln0_w"], t["ln0_b"], e)
    heads = []
    for n in "qkv":
        flat = fd.ops.linear(ln0, t[f"w{n}"], t[f"b{n}"])
        heads.append(fd.ops.permute(fd.ops.reshape(flat, [b, s, h, hd]), [0, 2, 1, 3]))
    attn, _, _, _ = fd.ops.sdpfa_fwd(*heads, is_causal=True)
    attn = fd.ops.reshape(fd.ops.permute(attn, [0, 2, 1, 3]), [b, s, e])
    proj = fd.ops.linear(attn, t["wo"], t["bo"])
    res0 = fd.ops.add(t["x"], proj)
    ln1 = layer_norm(fd, res0, t["ln1_w"], t["ln1_b"], e)
    mlp = fd.ops.linear(fd.ops.gelu(fd.ops.linear(ln1, t["w1"], t["b1"])), t["w2"], t["b2"])
    fd.add_output(fd.ops.add(res0, mlp))
    return t, proj, mlp


def reference(p, b, s, h, hd):
    e = h * hd
    ln0 = F.layer_norm(p["x"], [e], p["ln0_w"], p["ln0_b"], EPS)
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, h, hd).transpose(1, 2) for n in "qkv")
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, e)
    res0 = p["x"] + F.linear(attn, p["wo"], p["bo"])
    ln1 = F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], EPS)
    return res0 + F.linear(F.gelu(F.linear(ln1, p["w1"], p["b1"])), p["w2"], p["b2"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--form", choices=["tp", "sp"], default="tp")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--heads-per-rank", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--print-program", action="store_true")
    args = parser.parse_args()

    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    device = torch.device("cuda", comm.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # flash attention: half/bf16
    dtype = DataType.BFloat16 if device.type == "cuda" else DataType.Float
    mesh = DeviceMesh(range(d))
    b, s, h, hd = args.batch, args.seq, args.heads_per_rank * d, args.head_dim
    e = h * hd
    assert s % d == 0, f"--seq {s} must split evenly over {d} ranks"
    shapes = {"x": [b, s, e], "ln0_w": [e], "ln0_b": [e], "wq": [e, e], "bq": [e], "wk": [e, e], "bk": [e],
              "wv": [e, e], "bv": [e], "wo": [e, e], "bo": [e], "ln1_w": [e], "ln1_b": [e], "w1": [4 * e, e],
              "b1": [4 * e], "w2": [e, 4 * e], "b2": [e]}
    # Column-parallel weights split their output features, row-parallel ones their input features.
    split_axis = {"wq": 0, "bq": 0, "wk": 0, "bk": 0, "wv": 0, "bv": 0, "w1": 0, "b1": 0, "wo": 1, "w2": 1}
    if args.form == "sp":
        split_axis["x"] = 1

    def shard(tv, axis):
        tv.set_device_mesh(mesh)
        tv.outer_split(axis, d)
        tv.axis(axis).parallelize(ParallelType.mesh_x)

    with FusionDefinition() as fd:
        t, proj, mlp = define_block(fd, shapes, b, s, h, hd, dtype)
        for n, tv in t.items():
            tv.set_device_mesh(mesh)
            if n in split_axis:
                shard(tv, split_axis[n])
        if args.form == "sp":
            shard(proj, 1)
            shard(mlp, 1)

    g = torch.Generator().manual_seed(0)  # the same unsharded parameters on every rank
    params = {n: (torch.randn(shape, generator=g) * (e ** -0.5 if n[0] == "w" else 1.0)).to(torch_dtype)
              for n, shape in shapes.items()}
    inputs = [(mesh.shard_tensor(p, split_axis[n], rank) if n in split_axis else p).to(device)
              for n, p in params.items()]
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(inputs)
    comms = [k.name.split()[0] for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    expected = reference({n: p.float() for n, p in params.items()}, b, s, h, hd)
    if args.form == "sp":
        expected = mesh.shard_tensor(expected, 1, rank)
    error = (out.float().cpu() - expected).abs().max().item()
    if args.print_program and rank == 0:
        print(fd.host_program())
    print(f"rank {rank}/{d} {args.form}: output {tuple(out.shape)} on {device}, communications {comms}, "
          f"max |error| vs PyTorch {error:.2e}")


if __name__ == "__main__":
    main()
