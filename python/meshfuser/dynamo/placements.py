"""Placements inside a global program: `meshfuser::annotate(x, spec)`.

In a DTensor graph the user's code says where a value must be sharded at a few points: a
`DTensor.from_local`, a `to_local`, a `redistribute`. The global program keeps those points as
`annotate(x, spec)` (a copy, for tracing; `spec` indexes a (torch DeviceMesh, placements) pair
registered here), whose gradient is annotated with the same placements (a Partial one becomes
Replicate, as DTensor gives gradients). In a meshfuser program an annotate is a `set` whose output
is sharded as the placements say, and meshfuser plans the communication; on ATen it is a
`DTensor.redistribute`.
"""
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

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
def annotate(x: torch.Tensor, spec: int) -> torch.Tensor:
    return x.clone()


@annotate.register_fake
def _annotate_fake(x, spec):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.spec = inputs[1]


def _backward(ctx, grad):
    mesh, placements = _SPECS[ctx.spec]
    return annotate(grad, spec_id(mesh, gradient_placements(placements))), None


annotate.register_autograd(_backward, setup_context=_setup)

ANNOTATE = torch.ops.meshfuser.annotate.default


def redistribute(x, spec_index):
    """An annotate left on ATen: the DTensor is redistributed (Partial ones reduced)."""
    mesh, placements = _SPECS[spec_index]
    if tuple(x.placements) == placements:
        return x
    return x.redistribute(mesh, placements)
