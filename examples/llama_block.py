"""A Llama-style block forward, sharded over every rank: tensor parallel (TP) or sequence parallel (SP).

    torchrun --nproc_per_node=2 examples/llama_block.py --form tp
    torchrun --nproc_per_node=2 examples/llama_block.py --form sp --print-program

RMSNorm -> column-parallel q/k/v -> RoPE (rotate_half from slice, neg and cat; cos/sin tables as
inputs) -> causal attention on this rank's heads -> row-parallel output projection -> residual ->
RMSNorm -> SiLU-gated MLP (column-parallel gate and up, row-parallel down) -> residual.
TP: two Allreduce; SP: an Allgather before each column-parallel part, a ReduceScatter after each
row-parallel linear. Runs on CPUs (Gloo) or GPUs (NCCL, bfloat16); checks its shard against
unsharded PyTorch. The block itself lives in examples/transformer_blocks.py.
"""
import argparse

import torch

import meshfuser
from meshfuser import DeviceMesh

import transformer_blocks as blocks


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--form", choices=blocks.FORMS, default="tp")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--heads-per-rank", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--ffn-per-rank", type=int, default=344)
    parser.add_argument("--print-program", action="store_true")
    args = parser.parse_args()

    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    # Ranks may share GPUs (CUDA tensors over Gloo, MESHFUSER_CUDA_BACKEND=gloo): wrap around them.
    device = (torch.device("cuda", comm.local_rank() % torch.cuda.device_count()) if torch.cuda.is_available()
              else torch.device("cpu"))
    torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mesh = DeviceMesh(range(d))
    b, s, h, hd, ffn = args.batch, args.seq, args.heads_per_rank * d, args.head_dim, args.ffn_per_rank * d
    e = h * hd
    assert s % d == 0, f"--seq {s} must split evenly over {d} ranks"
    assert hd % 2 == 0, "RoPE rotates pairs: --head-dim must be even"

    full = blocks.llama_parameters(b, s, e, hd, ffn, seed=0, dtype=torch_dtype)  # the same on every rank
    local = {n: t.to(device) for n, t in blocks.llama_shard(full, args.form, d, rank).items()}
    x = local.pop("x")
    fd = blocks.llama_forward_definition(b, s, h, hd, ffn, d, args.form, blocks.to_meshfuser_dtype(torch_dtype))
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(blocks.llama_forward_inputs(x, local))
    expected = blocks.llama_reference({n: t.float() for n, t in full.items()}, h)
    if args.form == "sp":
        expected = mesh.shard_tensor(expected, 1, rank)
    error = (out.float().cpu() - expected).abs().max().item()
    if args.print_program and rank == 0:
        print(fd.host_program())
    print(f"rank {rank}/{d} {args.form}: output {tuple(out.shape)} on {device}, communications "
          f"{blocks.communications(prof.profile)}, max |error| vs PyTorch {error:.2e}")
    blocks.require_close(f"rank {rank} output", error, expected, torch_dtype)


if __name__ == "__main__":
    main()
