"""Code between `to_local()` and `from_local()` read as global code, and when that is wrong.

A DTensor graph's global program runs the user's local code (e.g. Hugging Face's head reshapes and
attention between a column-parallel and a row-parallel projection) on global tensors. That equals
what each rank computes on its shard only where the code treats the sharded axis as a batch of
independent blocks: elementwise ops, transposes, views that split or merge the sharded axis as
the outer part, reductions and contractions over other axes, attention over batch or heads. Anything
else (a sum over the sharded axis, a flatten putting it inside another axis, a slice of it) would
silently give other numbers, so it is refused with an error naming the op.

The sharded axis of each local value is found from shapes: its local shape (what Dynamo traced)
against its global shape (what the global program computes, from an fx.Interpreter on fake tensors).
"""
import math
import operator

import torch
import torch.fx as fx

from .. import _C
from .importer import node_val

_ELEMENTWISE = {
    "add", "sub", "mul", "truediv", "div", "neg", "pow", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "sin",
    "cos", "rsqrt", "sqrt", "erf", "where", "float", "half", "bfloat16", "to", "type_as", "contiguous", "clone",
    "detach", "masked_fill", "clamp", "abs", "log", "reciprocal", "dropout", "iadd", "imul", "isub", "itruediv",
    "radd", "rmul", "rsub", "rtruediv", "floordiv", "mod", "eq", "ne", "lt", "le", "gt", "ge", "annotate",
}
_PERMUTES = {"transpose", "permute", "t", "swapaxes", "movedim"}
_VIEWS = {"view", "reshape", "unflatten", "flatten", "unsqueeze", "squeeze", "expand", "view_as", "reshape_as",
          "expand_as"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "softmax", "log_softmax", "var", "std", "norm",
               "logsumexp", "cumsum", "argmax", "argmin", "prod", "all", "any"}
_MATMULS = {"matmul", "bmm", "mm", "baddbmm"}


def _name(node):
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


class _Shapes(fx.Interpreter):
    """Runs the global program on fake tensors, recording every node's global shape."""

    def __init__(self, gm):
        super().__init__(gm)
        self.shapes = {}

    def run_node(self, n):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.shapes[n.name] = tuple(int(s) for s in result.shape)
        return result


def _sharded(local, global_):
    if local is None or global_ is None or len(local) != len(global_):
        return []
    return [i for i, (l, g) in enumerate(zip(local, global_)) if l != g]


def _dims(node, rank):
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dim is None:
        return set(range(rank))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return {d % rank for d in dims if isinstance(d, int)}


def _view_keeps_blocks(in_local, in_global, out_local, out_global, k_in, k_out):
    """A view keeps each rank's block when the axes before the sharded one hold as many elements
    before and after it, locally and globally (the sharded axis is split or merged as the outer part)."""
    return (math.prod(in_local[:k_in]) == math.prod(out_local[:k_out])
            and math.prod(in_global[:k_in]) == math.prod(out_global[:k_out]))


def check(gm: fx.GraphModule, fakes, fake_mode):
    """Raises meshfuser.ArgumentError for local code the global program cannot stand for."""
    local_nodes = set()
    for node in gm.graph.nodes:
        if node.meta.get("mf_to_local"):
            local_nodes.add(node)
        elif node.op in ("call_function", "call_method") and not isinstance(node_val(node), _dtensor_type()) \
                and any(a in local_nodes for a in node.all_input_nodes):
            local_nodes.add(node)
    if not any(n.op != "placeholder" and not n.meta.get("mf_to_local") for n in local_nodes):
        return
    interpreter = _Shapes(gm)
    with fake_mode:
        interpreter.run(*fakes)
    shapes = interpreter.shapes

    def local_shape(n):
        val = node_val(n)
        if isinstance(val, _dtensor_type()):  # a to_local folded into the redistribute before it
            val = val._local_tensor
        if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
            return None  # symbolic sizes: not checked
        return tuple(val.shape)

    for node in gm.graph.nodes:
        if node not in local_nodes or node.meta.get("mf_to_local"):
            continue
        inputs = [a for a in node.all_input_nodes if isinstance(node_val(a), torch.Tensor)]
        sharded_inputs = [(a, _sharded(local_shape(a), shapes.get(a.name))) for a in inputs]
        sharded_inputs = [(a, s) for a, s in sharded_inputs if s]
        if not sharded_inputs or local_shape(node) is None and isinstance(node_val(node), torch.Tensor):
            continue
        reason = _why_not(node, sharded_inputs, local_shape, shapes)
        if reason:
            axis = sharded_inputs[0][1][0]
            raise _C.ArgumentError(
                f"torch.compile(backend='meshfuser'): `{_name(node)}` ({node.format_node()}) runs on local tensors "
                f"(between to_local() and from_local()) and {reason}. meshfuser runs such code as one global "
                f"program, where the local tensor is a shard of a value split on axis {axis}; there this op would "
                f"compute something else than each rank's local code. Keep the value a DTensor there (e.g. "
                f"use_local_output=False) or move the op before to_local()")


def _dtensor_type():
    from torch.distributed.tensor import DTensor
    return DTensor


def _why_not(node, sharded_inputs, local_shape, shapes):
    name = _name(node)
    out_local, out_global = local_shape(node), shapes.get(node.name)
    if name in _ELEMENTWISE or name in _PERMUTES:
        return None
    if name == "getitem" and node.target is operator.getitem:
        a, k = sharded_inputs[0][0], sharded_inputs[0][1][0]
        pair = (local_shape(a)[k], shapes[a.name][k])
        if out_local is not None and any((l, g) == pair for l, g in zip(out_local, out_global or ())):
            return None
        return "indexes or slices the sharded axis"
    if name in _VIEWS:
        a, (k_in, *rest) = sharded_inputs[0]
        k_out = _sharded(out_local, out_global)
        if rest or len(k_out) != 1 or not _view_keeps_blocks(local_shape(a), shapes[a.name], out_local, out_global,
                                                              k_in, k_out[0]):
            return "reshapes the sharded axis other than as the outer part of a split or merge"
        return None
    if name in _REDUCTIONS:
        for a, ks in sharded_inputs:
            if set(ks) & _dims(node, len(local_shape(a))):
                return "reduces over the sharded axis"
        return None
    if name in _MATMULS or node.target is operator.matmul:
        a, b = (node.args + (None, None))[:2]
        for operand, contracted in ((a, -1), (b, -2)):
            for x, ks in sharded_inputs:
                if x is operand and (contracted % len(local_shape(x))) in ks:
                    return "contracts over the sharded axis"
        return None
    if name == "scaled_dot_product_attention":
        if all(k in (0, 1) for _a, ks in sharded_inputs for k in ks):
            return None
        return "attends over a sharded sequence or head dimension"
    if name == "cat":
        for a, ks in sharded_inputs:
            if _dims(node, len(local_shape(a))) & set(ks):
                return "concatenates along the sharded axis"
        return None
    return "is not known to act on each block of the sharded axis alone"
