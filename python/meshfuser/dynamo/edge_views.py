"""Views at the edge of a meshfuser partition run on ATen.

Requires: partitions proposed by the capability-based partitioner (not fused yet). Guarantees: no
partition hands a view (permute, transpose, reshape, ...) to a node outside it; it hands the view's
source instead and the view runs on ATen; views read by both sides are duplicated (the partition
keeps its copy). After fusing, `reshape_views_of_programs` makes every ATen `view` of a program's
result a `reshape`.

Why: a meshfuser program's outputs are new row-major tensors, so a view it returned is a copy
(the transposed weight gradients of every linear, the heads of v saved for the backward, the
permuted q handed to an attention that runs on ATen), and in a layout other than the one traced
(an ATen `view` after it could fail). On ATen the view costs nothing and has the traced layout
whenever its source has. A `view` traced on a tensor whose layout meshfuser's row-major result does
not share (a transposed attention output) would fail; `reshape` is the same view where possible
and a copy otherwise.
"""
import operator

import torch
import torch.fx as fx

from .aten_ops import VIEW_OPS

aten = torch.ops.aten
_VIEW_TARGETS = (aten.view.default, aten._unsafe_view.default)


def _movable(node):
    """A single-tensor view of a single tensor (not a split's pieces, not a getitem)."""
    if node.op != "call_function" or node.target not in VIEW_OPS or node.target is operator.getitem:
        return False
    val = node.meta.get("val")
    source = node.args[0] if node.args else None
    return isinstance(val, torch.Tensor) and isinstance(source, fx.Node) and \
        isinstance(source.meta.get("val"), torch.Tensor)


def move_edge_views(partition, order, reasons, reason):
    """Takes the views whose results leave `partition` out of it (see the module doc). `order`:
    node -> position in the graph; `reasons` (node name -> why on ATen) gets `reason` for each view
    that now runs on ATen."""
    # Later views first, so that a chain of views leaves the partition from its end.
    for node in sorted(partition.nodes, key=lambda n: -order[n]):
        if not _movable(node):
            continue
        outside = [u for u in node.users if u not in partition.nodes]
        if not outside:
            continue
        if len(outside) == len(node.users):
            partition.remove_node(node)
            reasons[node.name] = reason
            continue
        with node.graph.inserting_after(node):
            twin = node.graph.node_copy(node)
        twin.meta = dict(node.meta)
        reasons[twin.name] = reason
        for user in outside:
            user.replace_input_with(node, twin)


def reshape_views_of_programs(gm: fx.GraphModule):
    """ATen `view`s reading (through other views) a program's result become `reshape`s."""
    def from_program(n):
        while isinstance(n, fx.Node):
            if n.op == "call_module":
                return True
            if n.op != "call_function" or not (n.target in VIEW_OPS or n.target is operator.getitem):
                return False
            n = n.args[0] if n.args else None
        return False

    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _VIEW_TARGETS and from_program(node.args[0]):
            node.target = aten.reshape.default
