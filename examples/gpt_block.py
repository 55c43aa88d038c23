"""A GPT block, sharded over every rank: tensor parallel (TP) or sequence parallel (SP).

    torchrun --nproc_per_node=2 examples/gpt_block.py --form tp
    torchrun --nproc_per_node=2 examples/gpt_block.py --form sp --backward --print-program

LayerNorm -> column-parallel q/k/v -> causal attention on this rank's heads -> row-parallel output
projection -> residual -> LayerNorm -> column-parallel GELU MLP -> row-parallel projection ->
residual. TP keeps activations replicated (two Allreduce); SP splits them on the sequence (an
Allgather before each column-parallel part, a ReduceScatter after each row-parallel linear).
With --backward, the backward definition runs on the forward's saved activations.
Runs on CPUs (Gloo) or GPUs (NCCL, bfloat16); checks its shard against unsharded PyTorch.
The block itself lives in examples/transformer_blocks.py.
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
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--print-program", action="store_true")
    args = parser.parse_args()

    comm = meshfuser.Communicator.instance()
    d, rank = comm.size(), comm.rank()
    # Ranks may share GPUs (CUDA tensors over Gloo, MESHFUSER_CUDA_BACKEND=gloo): wrap around them.
    device = (torch.device("cuda", comm.local_rank() % torch.cuda.device_count()) if torch.cuda.is_available()
              else torch.device("cpu"))
    torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # flash attention: half/bf16
    dtype = blocks.to_meshfuser_dtype(torch_dtype)
    mesh = DeviceMesh(range(d))
    b, s, h, hd = args.batch, args.seq, args.heads_per_rank * d, args.head_dim
    e = h * hd
    assert s % d == 0, f"--seq {s} must split evenly over {d} ranks"
    sp = args.form == "sp"
    shard_seq = (lambda t: mesh.shard_tensor(t, 1, rank)) if sp else (lambda t: t)  # noqa: E731

    full = blocks.gpt_parameters(b, s, e, seed=0, dtype=torch_dtype)  # the same on every rank
    local = {n: t.to(device) for n, t in blocks.gpt_shard(full, args.form, d, rank).items()}
    x = local.pop("x")
    forward = blocks.gpt_forward_definition(b, s, h, hd, d, args.form, dtype)
    with meshfuser.Profiler() as prof:
        outputs = forward.execute(blocks.gpt_forward_inputs(x, local))
    comms = blocks.communications(prof.profile)

    reference = {n: t.float().requires_grad_() for n, t in full.items()}
    expected = blocks.gpt_reference(reference, h)
    # PyTorch's own error at this dtype (bfloat16 on GPUs) bounds what ours may be.
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(1)).to(torch_dtype)
    same_out, same_grads = (blocks.same_dtype_reference(blocks.gpt_reference, full, h, device, blocks.GPT_PARAMS,
                                                        dy if args.backward else None)
                            if torch_dtype != torch.float32 else (None, {}))
    error = (outputs[0].float().cpu() - shard_seq(expected.detach())).abs().max().item()
    if args.print_program and rank == 0:
        print(forward.host_program())
    print(f"rank {rank}/{d} {args.form}: output {tuple(outputs[0].shape)} on {device}, communications {comms}, "
          f"max |error| vs PyTorch {error:.2e}")
    same_error = blocks.baseline_error(None if same_out is None else shard_seq(same_out), shard_seq(expected.detach()))
    blocks.require_close(f"rank {rank} output", error, expected.detach(), torch_dtype, same_error)

    if args.backward:
        expected.backward(dy.float())
        backward = blocks.gpt_backward_definition(b, s, h, hd, d, args.form, dtype)
        with meshfuser.Profiler() as prof:
            grads = backward.execute(blocks.gpt_backward_inputs(shard_seq(dy).to(device), outputs, x, local))
        split = blocks.GPT_SPLIT | ({"x": 1} if sp else {})
        grad_error = blocks.check_gradients(blocks.GPT_PARAMS, grads, reference, same_grads, split, mesh, rank,
                                            torch_dtype)
        if args.print_program and rank == 0:
            print(backward.host_program())
        print(f"rank {rank}/{d} {args.form} backward: {len(grads)} gradients, communications "
              f"{blocks.communications(prof.profile)}, max |gradient error| vs autograd {grad_error:.2e}")


if __name__ == "__main__":
    main()
