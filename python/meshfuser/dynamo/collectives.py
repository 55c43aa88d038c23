"""Functional collectives the user wrote (`torch.distributed._functional_collectives`) as meshfuser
communications.

In a graph of plain tensors each rank computes on its own values; a collective is where they meet.
meshfuser reads `all_reduce(x)` as a program over a tensor `[ranks, *x.shape]` split across the ranks
on its first axis (each rank holding its x): the sum over that axis, replicated, is one Allreduce
that meshfuser plans and posts on its own process groups (max/min/avg alike). `all_gather_into_tensor`
is that tensor made whole (an Allgather), `reduce_scatter_tensor` the sum split again on the rows
(a ReduceScatter). Each becomes a small program of its own (`Collective`), replacing the collective
and its `wait_tensor`; the work around it is partitioned as usual. Collectives over a group that is
not all ranks stay on ATen (every rank must run a meshfuser program).
"""
import torch
import torch.fx as fx

from .. import _C
from ..fusion_definition import FusionDefinition
from ..mesh import DeviceMesh
from .aten_ops import DTYPES
from .importer import node_val

_FUNCOL = torch.ops._c10d_functional
_OPS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
_REDUCE = {"sum": "sum", "avg": "sum", "max": "max", "min": "min"}


def _ranks(group_name):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group
    return dist.get_process_group_ranks(_resolve_process_group(group_name))


class Collective:
    """One functional collective run as a meshfuser program (callable as an fx call_function)."""

    def __init__(self, kind, reduce_op, ranks, local_shape, dtype, title):
        self.kind, self.reduce_op, self.ranks = kind, reduce_op, ranks
        self.name = f"{title}.{kind}"
        self.__name__ = f"meshfuser_{kind}"
        d = len(ranks)
        mesh = DeviceMesh(ranks)
        fd = self.fd = FusionDefinition()
        with fd:
            x = fd.define_tensor([d] + list(local_shape), dtype=DTYPES[dtype])
            x.set_device_mesh(mesh)
            x.split(0, d, False)
            x.parallelize(0, _C.ParallelType.mesh_x)
            if kind == "all_gather":   # [d, n, ...] whole -> [d * n, ...]
                out = fd.ops.set(x)
                out.set_device_mesh(mesh)
                out = fd.ops.reshape(out, [d * local_shape[0]] + list(local_shape[1:]))
            else:
                out = getattr(fd.ops, _REDUCE[reduce_op])(x, [0])
                if reduce_op == "avg":
                    out = fd.ops.div(out, float(d))
                out = fd.ops.cast(out, DTYPES[dtype]) if out.dtype != DTYPES[dtype] else out
                if kind == "reduce_scatter":  # rows split again across the ranks
                    out = fd.ops.set(out)
                    out.set_device_mesh(mesh)
                    out.split(0, d, False)
                    out.parallelize(0, _C.ParallelType.mesh_x)
                else:
                    out.set_device_mesh(mesh)
            fd.add_output(out)

    def definitions(self):
        return [self.fd]

    def __call__(self, x):
        (out,) = self.fd.execute([x.unsqueeze(0)])
        return out

    def __repr__(self):
        return f"Collective({self.name})"


def why_not(node):
    """None when the functional collective `node` can be a meshfuser program, else why not."""
    import torch.distributed as dist
    kind = _OPS[node.target._overloadpacket.__name__]
    group = node.args[-1]
    if not isinstance(group, str):
        return "a collective whose group is not a name"
    if sorted(_ranks(group)) != list(range(dist.get_world_size())):
        return "a collective over a sub-group (meshfuser programs run on every rank)"
    if kind != "all_gather" and node.args[1] not in _REDUCE:
        return f"a reduction {node.args[1]!r}"
    val = node_val(node.args[0])
    if not isinstance(val, torch.Tensor) or val.dtype not in DTYPES or val.dim() == 0:
        return "a collective of a 0-d tensor or of a dtype meshfuser lacks"
    return None


def rewrite(gm: fx.GraphModule, title):
    """Replaces each functional collective (and its wait_tensor) that meshfuser can run by a
    Collective call; returns the reasons for the others, by node name."""
    reasons = {}
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node.target, "namespace", None) != "_c10d_functional":
            continue
        name = node.target._overloadpacket.__name__
        if name not in _OPS:
            continue
        reason = why_not(node)
        if reason is not None:
            reasons[node.name] = reason
            continue
        val = node_val(node.args[0])
        kind = _OPS[name]
        collective = Collective(kind, None if kind == "all_gather" else node.args[1], sorted(_ranks(node.args[-1])),
                                [int(s) for s in val.shape], val.dtype, title)
        with graph.inserting_before(node):
            new = graph.call_function(collective, (node.args[0],))
        new.meta = dict(node.meta)
        for user in list(node.users):
            if user.op == "call_function" and user.target is _FUNCOL.wait_tensor.default:
                user.replace_all_uses_with(new)
                graph.erase_node(user)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    gm.recompile()
    return reasons
