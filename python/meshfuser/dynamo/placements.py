"""Placements inside a global program: `meshfuser::annotate(x, spec)`.

In a DTensor graph the user's code says where a value must be sharded at a few points: a
`DTensor.from_local`, a `to_local`, a `redistribute`. The global program keeps those points as
`annotate(x, spec, grad_spec)` (a copy, for tracing; a spec indexes a (torch DeviceMesh,
placements) pair registered here). Its gradient is annotated with `grad_spec` (-1: not at all):
what DTensor's backward of that point asks for, the placements the value had before it (a
redistribute's backward brings the gradient back to the input's placements; to_local's and
from_local's keep them). In a meshfuser program an annotate is a `set` whose output
is sharded as the placements say, and meshfuser plans the communication; on ATen it is a
`DTensor.redistribute`.
"""
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

_SPECS = []   # spec id -> (torch DeviceMesh, placements tuple)


def normalized(placements, ndim):
    return tuple(Shard(p.dim % ndim) if isinstance(p, Shard) and ndim else p for p in placements)


def spec_id(mesh, placements):
    placements = tuple(placements)
    for i, (m, p) in enumerate(_SPECS):
        if m is mesh and p == placements:
            return i
    _SPECS.append((mesh, placements))
    return len(_SPECS) - 1


def spec(i):
    return _SPECS[i]


def gradient_placements(placements):
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


@torch.library.custom_op("meshfuser::annotate", mutates_args=())
def annotate(x: torch.Tensor, spec: int, grad_spec: int) -> torch.Tensor:
    return x.clone()


@annotate.register_fake
def _annotate_fake(x, spec, grad_spec):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.grad_spec = inputs[2]


def _backward(ctx, grad):
    if ctx.grad_spec < 0:
        return grad, None, None
    return annotate(grad, ctx.grad_spec, -1), None, None


annotate.register_autograd(_backward, setup_context=_setup)

ANNOTATE = torch.ops.meshfuser.annotate.default


def redistribute(x, spec_index, grad_spec=-1):
    """An annotate left on ATen: the DTensor is redistributed (Partial ones reduced)."""
    mesh, placements = _SPECS[spec_index]
    if tuple(x.placements) == placements:
        return x
    return x.redistribute(mesh, placements)


def replicated(x, mesh):
    """A plain tensor of a global program (made from constants: the same on every rank) as a
    replicated DTensor; anything else as it is."""
    if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
        return DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return x


def on_dtensors(op, mesh):
    """An ATen op of a global program run on DTensors: plain tensor arguments and results (made
    from constants, as an arange) become replicated DTensors, so DTensor never sees a mix."""
    def run(*args, **kwargs):
        args = [replicated(a, mesh) for a in args]
        args = [[replicated(x, mesh) for x in a] if isinstance(a, (list, tuple)) else a for a in args]
        result = op(*args, **kwargs)
        if isinstance(result, (list, tuple)):
            return type(result)(replicated(r, mesh) for r in result)
        return replicated(result, mesh)
    run.__name__ = f"on_dtensors_{getattr(op, '__name__', 'op').replace('.', '_')}"
    return run
