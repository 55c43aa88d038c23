"""Rewrites of AOTAutograd's ATen graphs that both backend paths (backend.py for local tensors,
dtensor_program.py for DTensor graphs) apply before partitioning, and the decompositions they trace
with. Kept apart from backend.py so that dtensor_program.py needs nothing from it."""
import functools

import torch.fx as fx
from torch._decomp import get_decompositions

from .aten_ops import DECOMPOSE, aten


def _is_transpose_2d(node):
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    val = node.meta.get("val")
    if not hasattr(val, "dim") or val.dim() != 2:  # none, or a multi-output node's tuple
        return False
    return node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) in ([1, 0],
                                                                                                             [-1, 0]))


def use_linear(gm: fx.GraphModule):
    """mm(x, w.t()) -> linear(x, w), addmm(b, x, w.t()) -> linear(x, w, b): the form meshfuser's
    sharding propagation knows (a weight [out, in]) and that runs as one GEMM call. Also drops
    `_assert_tensor_metadata` checks, which hold by construction."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten._assert_tensor_metadata.default:
            graph.erase_node(node)  # a tracing-time check of dtype/device (from .to()): holds by construction
            continue
        if node.target is aten.mm.default and _is_transpose_2d(node.args[1]):
            x, wt = node.args
            if _is_transpose_2d(wt.args[0]):  # mm(x, t(t(w))): the transposes cancel (no view to run)
                node.args = (x, wt.args[0].args[0])
                continue
            args = (x, wt.args[0])
        elif node.target is aten.addmm.default and not node.kwargs and _is_transpose_2d(node.args[2]) \
                and node.args[0].meta.get("val") is not None and node.args[0].meta["val"].dim() == 1:
            bias, x, wt = node.args
            args = (x, wt.args[0], bias)
        else:
            continue
        with graph.inserting_before(node):
            linear = graph.call_function(aten.linear.default, args)
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in (aten.linear.default, aten.mm.default):
            _unflatten_rows(graph, node)
    graph.eliminate_dead_code()
    gm.recompile()
    return gm


def transpose_products(gm: fx.GraphModule):
    """t(mm(a, b)) -> mm(t(b), t(a)) (transposes of transposes cancel): the product in the layout
    its reader wants, at no cost (a transposed operand is a GEMM layout flag). A linear's weight
    gradient comes out of AOTAutograd as t(mm(t(x), dy)), a transposed [in, out] product returned
    through a view at the partition's edge; now the program computes dy^T @ x in the parameter's
    [out, in] layout itself. (Measured on an H100: the HF Llama layer step's 0.19 ms strided ATen
    copy, suspected to be these gradients, stayed; the program's output layout had already matched.)"""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if not _is_transpose_2d(node):
            continue
        product = node.args[0]
        if not (isinstance(product, fx.Node) and product.op == "call_function" and product.target is aten.mm.default
                and len(product.users) == 1 and product.meta.get("val") is not None):
            continue
        a, b = product.args
        with graph.inserting_before(node):
            operands = [_transposed(graph, x) for x in (b, a)]
            new = graph.call_function(aten.mm.default, tuple(operands))
        new.meta = dict(node.meta)
        new.meta["val"] = aten.mm.default(*(x.meta["val"] for x in operands))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        graph.erase_node(product)
        changed = True
    if changed:
        graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _transposed(graph, x):
    """t(x) as a node: the source of a 2-d transpose, else a new transpose of x."""
    if _is_transpose_2d(x):
        return x.args[0]
    t = graph.call_function(aten.t.default, (x,))
    t.meta = {"val": x.meta["val"].t()}
    return t


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _unflatten_rows(graph, node):
    """view(linear(view(x, [b*s, k]), w), [b, s, n]) -> linear(x, w): decomposition flattened the
    leading axes of a linear's input (and mm's, in the backward); keeping them lets a sharding of
    one of them (the sequence) pass through the GEMM, so that a partial product is reduce-scattered
    along it instead of all-reduced and sliced."""
    flat = node.args[0]
    if not (isinstance(flat, fx.Node) and flat.op == "call_function" and flat.target in _VIEWS):
        return
    x = flat.args[0]
    x_val, flat_val, out_val = x.meta.get("val"), flat.meta.get("val"), node.meta.get("val")
    if x_val is None or flat_val is None or out_val is None or x_val.dim() < 3 or flat_val.dim() != 2:
        return
    if x_val.shape[-1] != flat_val.shape[-1] or len(node.users) != 1:
        return
    (user,) = node.users
    if user.op != "call_function" or user.target not in _VIEWS:
        return
    if list(user.meta["val"].shape) != list(x_val.shape[:-1]) + [out_val.shape[-1]]:
        return
    target = aten.linear.default if node.target is aten.linear.default else aten.matmul.default
    with graph.inserting_before(user):
        new = graph.call_function(target, (x,) + tuple(node.args[1:]))
    new.meta = dict(user.meta)
    user.replace_all_uses_with(new)
    graph.erase_node(user)
    graph.erase_node(node)



@functools.lru_cache(maxsize=None)
def decompositions():
    """The ATen decompositions both paths trace with (aten_ops.DECOMPOSE)."""
    return get_decompositions(DECOMPOSE)
