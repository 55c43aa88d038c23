"""A mixture-of-experts layer (DeepSeek-like: softmax router, top-k routed SwiGLU experts plus one
shared expert) with expert parallelism, as one meshfuser program per rank, checked against PyTorch
autograd on the unsharded layer.

    python examples/moe_layer.py                          # one process: all experts local
    torchrun --nproc_per_node=4 examples/moe_layer.py     # 4-way expert parallelism
    torchrun --nproc_per_node=4 examples/moe_layer.py --tp 2   # 2 expert groups x 2-way TP

The layer, on this rank's tokens x [tokens, hidden]:
  router: probs = softmax(x @ router^T); weights, chosen = topk(probs, k)
  permute: the tokens' k copies sorted by expert (argsort), counted per expert (bincount)
  dispatch: an AllToAll of the counts, then an AllToAllV of the rows to the ranks holding their
            experts (the received row count is known only at run time)
  experts: grouped SwiGLU, silu(x W_gate) * (x W_up) W_down, one grouped GEMM per projection
  combine: the reverse AllToAllV; unpermute: index_add of the rows scaled by their routing weights
  plus the shared expert, a dense SwiGLU MLP on every token.
Mesh [ep, tp] (mesh_y, mesh_x): tokens are rank-local per expert group (data parallel over ep, the
same on the tp ranks of a group); each group holds experts / ep experts, whose ffn features are
split over tp (column-parallel gate/up, row-parallel down: an Allreduce), as are the shared
expert's. The training definition computes the output and every gradient in one program: the
backward of the dispatch is a combine and vice versa. Router and shared-expert gradients are this
expert group's tokens' share (sum them over the groups, as data-parallel training does); expert
weight gradients are complete (every token routed to them was received).
"""
import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType

PARAMS = ["x", "router", "w_gate", "w_up", "w_down", "s_gate", "s_up", "s_down"]
# Axis of each expert weight holding the experts, and the ffn axis tensor parallelism splits.
EXPERT_AXIS = {"w_gate": 0, "w_up": 0, "w_down": 0}
FFN_AXIS = {"w_gate": 2, "w_up": 2, "w_down": 1, "s_gate": 0, "s_up": 0, "s_down": 1}
_DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


@dataclass
class MoeConfig:
    tokens: int = 16      # per expert group
    hidden: int = 32
    ffn: int = 16         # per expert
    experts: int = 8
    topk: int = 2
    shared_ffn: int = 16  # the shared expert's
    dtype: torch.dtype = torch.float32


def shapes(cfg):
    """Global shapes of PARAMS (every expert, every ffn feature)."""
    h, f, e, s = cfg.hidden, cfg.ffn, cfg.experts, cfg.shared_ffn
    return {"x": [cfg.tokens, h], "router": [e, h], "w_gate": [e, h, f], "w_up": [e, h, f], "w_down": [e, f, h],
            "s_gate": [s, h], "s_up": [s, h], "s_down": [h, s]}


def make_mesh(world, tp):
    if world % tp:
        raise ValueError(f"--tp {tp} does not divide the {world} ranks")
    return DeviceMesh(torch.arange(world).view(world // tp, tp)) if tp > 1 else DeviceMesh(range(world))


def ep_axis(mesh):
    return ParallelType.mesh_y if len(mesh.shape) == 2 else ParallelType.mesh_x


# ---- the meshfuser definition -------------------------------------------------------------------
def _dsilu(fd, a):
    """d silu(a) / da = sigmoid(a) * (1 + a * (1 - sigmoid(a)))."""
    s = fd.ops.sigmoid(a)
    return fd.ops.mul(s, fd.ops.add(fd.ops.mul(a, fd.ops.sub(1.0, s)), 1.0))


def _t(fd, w):
    """The last two axes of a 2-D or 3-D weight swapped."""
    return fd.ops.permute(w, [1, 0] if w.ndim == 2 else [0, 2, 1])


def define_moe(fd, cfg, mesh=None, training=False, schedule=True):
    """The layer on this rank (its expert group's tokens, its experts). Outputs: y, and with
    `training` the gradients of PARAMS for the output gradient `grad_y` (an extra last input).
    `schedule=False` leaves the meshes and splits to meshfuser.dtensor.compile, whose expert mesh
    (fd.expert_mesh) is then the mesh."""
    mesh = fd.expert_mesh if mesh is None else mesh
    ep = mesh.shape[0] if len(mesh.shape) == 2 else mesh.size
    tp = mesh.shape[1] if len(mesh.shape) == 2 else 1
    local = cfg.experts // ep
    dt = _DTYPES[cfg.dtype]
    shp = shapes(cfg)
    shp.update({w: [local] + shp[w][1:] for w in EXPERT_AXIS})  # this group's experts
    t = {name: fd.define_tensor(shp[name], dtype=dt, name=name) for name in PARAMS}
    n, k, h = cfg.tokens, cfg.topk, cfg.hidden
    x = t["x"]

    logits = fd.ops.cast(fd.ops.linear(x, t["router"]), DataType.Float)  # router in float32
    e = fd.ops.exp(fd.ops.sub(logits, fd.ops.max(logits, [1], keepdim=True)))
    probs = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
    weights, chosen = fd.ops.topk(probs, k, dim=1)
    flat = fd.ops.reshape(chosen, [n * k])
    order = fd.ops.argsort(flat, dim=0, stable=True)                     # the k copies, by expert
    token_of = fd.ops.cast(fd.ops.div(order, float(k)), DataType.Int)    # order // k
    routed = fd.ops.index_select(x, 0, token_of)
    counts = fd.ops.bincount(flat, cfg.experts)
    recv, recv_counts = fd.ops.all_to_all_dispatch(routed, counts, mesh, ep_axis(mesh))
    offs = fd.ops.cumsum(fd.ops.sum(recv_counts, [0]), 0, dtype=DataType.Int32)
    gate = fd.ops.grouped_mm(recv, t["w_gate"], offs)
    up = fd.ops.grouped_mm(recv, t["w_up"], offs)
    act = fd.ops.mul(fd.ops.silu(gate), up)
    expert_out = fd.ops.grouped_mm(act, t["w_down"], offs)
    back = fd.ops.all_to_all_combine(expert_out, counts, recv_counts)
    rw = fd.ops.cast(fd.ops.index_select(fd.ops.reshape(weights, [n * k]), 0, order), dt)
    weighted = fd.ops.mul(back, fd.ops.broadcast_in_dim(rw, [n * k, h], [0]))
    zeros = fd.ops.mul(x, 0.0)
    s_gate = fd.ops.linear(x, t["s_gate"])
    s_up = fd.ops.linear(x, t["s_up"])
    s_act = fd.ops.mul(fd.ops.silu(s_gate), s_up)
    y = fd.ops.add(fd.ops.index_add(zeros, 0, token_of, weighted), fd.ops.linear(s_act, t["s_down"]))
    fd.add_output(y)
    grads = {}
    if training:
        gy = fd.define_tensor([n, h], dtype=dt, name="grad_y")
        # shared expert
        g_sact = fd.ops.matmul(gy, t["s_down"])
        grads["s_down"] = fd.ops.matmul(_t(fd, gy), s_act)
        g_sgate = fd.ops.mul(fd.ops.mul(g_sact, s_up), _dsilu(fd, s_gate))
        g_sup = fd.ops.mul(g_sact, fd.ops.silu(s_gate))
        grads["s_gate"] = fd.ops.matmul(_t(fd, g_sgate), x)
        grads["s_up"] = fd.ops.matmul(_t(fd, g_sup), x)
        g_x = fd.ops.add(fd.ops.matmul(g_sgate, t["s_gate"]), fd.ops.matmul(g_sup, t["s_up"]))
        # unpermute and combine: gradients go to the experts as the rows did (a dispatch)
        g_weighted = fd.ops.index_select(gy, 0, token_of)
        g_rw = fd.ops.sum(fd.ops.cast(fd.ops.mul(g_weighted, back), DataType.Float), [1])
        g_back = fd.ops.mul(g_weighted, fd.ops.broadcast_in_dim(rw, [n * k, h], [0]))
        g_out, g_recv_counts = fd.ops.all_to_all_dispatch(g_back, counts, mesh, ep_axis(mesh))
        # the grouped SwiGLU experts
        g_act = fd.ops.grouped_mm(g_out, _t(fd, t["w_down"]), offs)
        grads["w_down"] = fd.ops.grouped_mm(_t(fd, act), g_out, offs)
        g_gate = fd.ops.mul(fd.ops.mul(g_act, up), _dsilu(fd, gate))
        g_up = fd.ops.mul(g_act, fd.ops.silu(gate))
        grads["w_gate"] = fd.ops.grouped_mm(_t(fd, recv), g_gate, offs)
        grads["w_up"] = fd.ops.grouped_mm(_t(fd, recv), g_up, offs)
        g_recv = fd.ops.add(fd.ops.grouped_mm(g_gate, _t(fd, t["w_gate"]), offs),
                            fd.ops.grouped_mm(g_up, _t(fd, t["w_up"]), offs))
        # back to the tokens (a combine), then through the permutation
        g_routed = fd.ops.all_to_all_combine(g_recv, counts, g_recv_counts)
        g_x = fd.ops.add(g_x, fd.ops.index_add(zeros, 0, token_of, g_routed))
        # router: topk and softmax backward
        g_wflat = fd.ops.index_add(fd.ops.mul(fd.ops.reshape(weights, [n * k]), 0.0), 0, order, g_rw)
        g_probs = fd.ops.scatter_add(fd.ops.mul(probs, 0.0), 1, chosen, fd.ops.reshape(g_wflat, [n, k]))
        g_logits = fd.ops.mul(probs, fd.ops.sub(g_probs, fd.ops.sum(fd.ops.mul(g_probs, probs), [1], keepdim=True)))
        g_logits = fd.ops.cast(g_logits, dt)
        grads["router"] = fd.ops.matmul(_t(fd, g_logits), x)
        grads["x"] = fd.ops.add(g_x, fd.ops.matmul(g_logits, t["router"]))
        for name in PARAMS:
            fd.add_output(grads[name])
        t["grad_y"] = gy
    if schedule:
        _schedule(t, grads, mesh, tp)
    return t


def _schedule(t, grads, mesh, tp):
    """Every tensor on the mesh; with tp > 1, ffn features split over mesh_x (weights and their
    gradients): column-parallel gate/up, row-parallel down."""
    for tv in list(t.values()) + list(grads.values()):
        tv.set_device_mesh(mesh)
    if tp == 1:
        return
    for name, axis in FFN_AXIS.items():
        for tv in [t[name]] + ([grads[name]] if name in grads else []):
            tv.outer_split(axis, tp)
            tv.axis(axis).parallelize(ParallelType.mesh_x)


def local_inputs(params, cfg, mesh, rank, grad_y=None):
    """This rank's inputs from the global PARAMS (x: every group's tokens stacked, [ep * tokens, h]):
    its group's tokens, its group's experts, its tp block of the ffn features."""
    coords = (rank // mesh.shape[1], rank % mesh.shape[1]) if len(mesh.shape) == 2 else (rank, 0)
    ep = mesh.shape[0] if len(mesh.shape) == 2 else mesh.size
    tp = mesh.shape[1] if len(mesh.shape) == 2 else 1
    out = []
    for name in PARAMS:
        v = params[name]
        if name == "x" or name in EXPERT_AXIS:
            v = v.chunk(ep, dim=0)[coords[0]]
        if name in FFN_AXIS and tp > 1:
            v = v.chunk(tp, dim=FFN_AXIS[name])[coords[1]]
        out.append(v.contiguous())
    if grad_y is not None:
        out.append(grad_y.chunk(ep, dim=0)[coords[0]].contiguous())
    return out


# ---- PyTorch: the same layer, unsharded -------------------------------------------------------
def grouped_mm_loop(a, b, offs):
    """torch._grouped_mm's meaning ([m, k] x [g, k, n], offsets) as a loop of matmuls (autograd)."""
    out, start = [], 0
    for g, end in enumerate(offs.tolist()):
        out.append(a[start:end] @ b[g])
        start = end
    return torch.cat(out)


def torch_moe(p, topk, grouped_mm=grouped_mm_loop):
    """The layer in eager PyTorch on p (a dict of PARAMS); grouped_mm may be torch._grouped_mm."""
    x = p["x"]
    probs = torch.softmax(F.linear(x, p["router"]).float(), dim=-1)
    weights, chosen = torch.topk(probs, topk, dim=-1)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // topk
    routed = x[token_of]
    offs = torch.bincount(flat, minlength=p["router"].shape[0]).cumsum(0).to(torch.int32)
    act = F.silu(grouped_mm(routed, p["w_gate"], offs)) * grouped_mm(routed, p["w_up"], offs)
    out = grouped_mm(act, p["w_down"], offs) * weights.reshape(-1)[order].to(x.dtype).unsqueeze(-1)
    shared = F.linear(F.silu(F.linear(x, p["s_gate"])) * F.linear(x, p["s_up"]), p["s_down"])
    return torch.zeros_like(x).index_add(0, token_of, out) + shared


def make_params(cfg, ep, device, seed=0):
    """Global parameters (x holds every expert group's tokens) from a fixed seed: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    p = {}
    for name, shape in shapes(cfg).items():
        shape = [shape[0] * ep] + shape[1:] if name == "x" else shape
        fan_in = shape[-2] if name in EXPERT_AXIS else shape[-1]
        p[name] = (torch.randn(shape, generator=g) / (1.0 if name == "x" else fan_in ** 0.5)).to(device, cfg.dtype)
    return p


def main():
    import meshfuser
    from transformer_blocks import require_close
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks inside each expert group")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per expert group")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=2)
    args = parser.parse_args()
    comm = meshfuser.Communicator.instance()
    world, rank = comm.size(), comm.rank()
    # Ranks may share GPUs (CUDA tensors over Gloo, MESHFUSER_CUDA_BACKEND=gloo): wrap around them.
    device = (torch.device("cuda", comm.local_rank() % torch.cuda.device_count()) if torch.cuda.is_available()
              else torch.device("cpu"))
    cfg = MoeConfig(tokens=args.tokens, experts=args.experts, topk=args.topk,
                    dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    mesh = make_mesh(world, args.tp)
    ep = mesh.shape[0] if len(mesh.shape) == 2 else mesh.size
    params = make_params(cfg, ep, device)
    grad_y = torch.randn(ep * cfg.tokens, cfg.hidden, generator=torch.Generator().manual_seed(1)).to(device, cfg.dtype)

    with FusionDefinition() as fd:
        define_moe(fd, cfg, mesh, training=True)
    outs = fd.execute(local_inputs(params, cfg, mesh, rank, grad_y))

    ref = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    y_ref = torch_moe(ref, cfg.topk)
    y_ref.backward(grad_y)
    group = rank // args.tp
    want_y = y_ref.detach().chunk(ep)[group]
    errors = [(outs[0].float() - want_y.float()).abs().max().item()]
    require_close(f"rank {rank} output", errors[0], want_y, cfg.dtype)
    expected = local_inputs({k: v.grad for k, v in ref.items()}, cfg, mesh, rank)
    # Router and shared-expert gradients are this group's tokens' share: summed over the expert
    # groups (the ranks of one tp coordinate), as data-parallel training does.
    columns = None
    if torch.distributed.is_initialized() and ep > 1:
        columns = [torch.distributed.new_group([g * args.tp + c for g in range(ep)]) for c in range(args.tp)]
    grad_errors = []
    for name, got, want in zip(PARAMS, outs[1:], expected):
        if name in ("router", "s_gate", "s_up", "s_down") and columns is not None:
            got = got.clone()
            torch.distributed.all_reduce(got, group=columns[rank % args.tp])
        grad_errors.append((got.float() - want.float()).abs().max().item())
        require_close(f"rank {rank} gradient of {name}", grad_errors[-1], want, cfg.dtype)
    if rank == 0:
        print(fd.host_program())
    print(f"rank {rank}: max |error| vs PyTorch {max(errors):.3e}")
    print(f"rank {rank}: max |gradient error| vs autograd {max(grad_errors):.3e}")


if __name__ == "__main__":
    main()
