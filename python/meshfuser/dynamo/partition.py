"""Split an AOTAutograd graph into meshfuser partitions and eager ATen nodes.

torch.fx's CapabilityBasedPartitioner groups the nodes meshfuser supports (aten_ops.TABLE, its
checks, and dtypes/shapes meshfuser takes) into partitions without cycles; each partition becomes a
MeshfuserProgram, everything else stays an ATen call in the graph. A partition made only of views
stays on ATen too (a view there costs nothing; a program would copy). `MESHFUSER_DUMP=partitions`
prints the report (logger "meshfuser.partitions"): each partition with its ops, and each node that
runs on ATen with the reason.
"""
import collections
import logging
import operator
import os

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from .aten_ops import CHECKS, DTYPES, TABLE, VIEW_OPS
from .edge_views import move_edge_views, reshape_views_of_programs
from .importer import MeshfuserProgram, node_val


def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _op_name(node):
    t = node.target
    if not hasattr(t, "_schema"):
        return getattr(t, "__name__", str(t))
    name = t._schema.name.split("::")[-1]
    return name if t._overloadname == "default" else f"{name}.{t._overloadname}"


def why_unsupported(node):
    """None when meshfuser takes the node, else the reason it runs on ATen."""
    if node.target not in TABLE:
        return "no meshfuser op for it" if hasattr(node.target, "_schema") or node.target is operator.getitem \
            else "a meshfuser program of its own"
    val = node_val(node)
    if val is None:
        return "no traced value"
    if not _tensors(val) and node.target is not operator.getitem:
        return "its result is not a tensor"
    for t in _tensors(val) + [t for a in node.all_input_nodes for t in _tensors(node_val(a))]:
        if t.dtype not in DTYPES:
            return f"dtype {t.dtype}"
        if any(not isinstance(s, int) for s in t.shape):
            return "symbolic shape"
        if t.device.type not in ("cpu", "cuda"):
            return f"device {t.device}"
    if any(isinstance(node_val(a), (torch.SymInt, torch.SymFloat)) for a in node.all_input_nodes):
        return "a symbolic scalar argument"
    if node.target is operator.getitem:
        src = node.args[0]
        if why_unsupported(src) is not None:
            return "its producer runs on ATen"
        if not isinstance(val, torch.Tensor):
            return "not a tensor"
        return None
    check = CHECKS.get(node.target)
    return check(node) if check is not None else None


_VIEWS_ONLY = "a partition of views only (ATen views copy nothing)"
_RETURNED_VIEW = "a view the graph only returns (ATen views copy nothing)"
_EDGE_VIEW = "a view at a partition's edge (ATen views copy nothing)"
_VIEW_REASONS = (_VIEWS_ONLY, _RETURNED_VIEW, _EDGE_VIEW)


class _Support(OperatorSupport):
    def __init__(self):
        super().__init__()
        self.reasons = {}  # node name -> why it runs on ATen

    def is_node_supported(self, submodules, node):
        if node.op != "call_function":
            return False
        reason = why_unsupported(node)
        if reason is None and node.target in VIEW_OPS and node.users and \
                all(u.op == "output" for u in node.users):
            # A view only returned (a transposed weight saved for the backward): free on ATen, a
            # copy as a program output.
            reason = _RETURNED_VIEW
        if reason is not None:
            self.reasons[node.name] = reason
        return reason is None


class Report:
    """What ran where, for one graph; printed under MESHFUSER_DUMP=partitions."""

    def __init__(self, title):
        self.title = title
        self.partitions = []   # (name, Counter of op names)
        self.eager = []        # (node name, op name, reason): what meshfuser could not take
        self.views = []        # (node name, op name, reason): views left to ATen on purpose (free there)
        self.programs = []     # the MeshfuserPrograms, in partition order (their definitions, host programs)

    def __str__(self):
        lines = [f"partitions {self.title}: {len(self.partitions)} meshfuser partition(s), "
                 f"{len(self.eager)} node(s) on ATen" + (f", {len(self.views)} view(s) on ATen" if self.views else "")]
        for name, ops in self.partitions:
            listed = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items()))
            lines.append(f"  {name}: {sum(ops.values())} ops: {listed}")
        for node, op, reason in self.eager + self.views:
            lines.append(f"  ATen {node} ({op}): {reason}")
        return "\n".join(lines)


_REPORTS = collections.deque(maxlen=256)


def reports():
    """The reports of the graphs compiled in this process, oldest first (at most 256 kept)."""
    return list(_REPORTS)


def clear_reports():
    _REPORTS.clear()


def dump_enabled():
    return "partitions" in os.environ.get("MESHFUSER_DUMP", "").split(",")


def _log(report):
    """Through meshfuser's one output channel: logger "meshfuser.partitions", every line prefixed
    with the rank, as the C++ dumps are."""
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    text = "\n".join(f"[meshfuser rank {rank}] {line}" for line in str(report).splitlines())
    logging.getLogger("meshfuser.partitions").info(text)


def partition(gm: fx.GraphModule, title, mesh=None):
    """Replaces supported parts of gm by MeshfuserProgram submodules; returns (gm, report). With
    `mesh` (a torch DeviceMesh) gm is a global program run on DTensors: the programs take DTensors,
    and placement annotations left on ATen become DTensor redistributions."""
    from . import collectives
    collective_reasons = collectives.rewrite(gm, title) if mesh is None else {}
    support = _Support()
    support.reasons.update(collective_reasons)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    report = Report(title)
    kept = []
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for p in proposed:
        if all(n.target in VIEW_OPS for n in p.nodes):
            for n in p.nodes:
                support.reasons[n.name] = _VIEWS_ONLY
            continue
        if mesh is None:  # on DTensors an ATen view may redistribute: DTensor programs keep theirs
            move_edge_views(p, order, support.reasons, _EDGE_VIEW)
        kept.append(p)
    fused = partitioner.fuse_partitions(kept)
    for node in fused.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, collectives.Collective):
            report.partitions.append((node.target.name, collections.Counter({node.target.kind: 1})))
            report.programs.append(node.target)
        elif node.op == "call_function" and node.target is not operator.getitem:
            reason = support.reasons.get(node.name) or why_unsupported(node)
            (report.views if reason in _VIEW_REASONS else report.eager).append((node.name, _op_name(node), reason))
    for node in list(fused.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        ops = collections.Counter(_op_name(n) for n in sub.graph.nodes if n.op == "call_function"
                                  and n.target is not operator.getitem)
        name = f"{title}.{node.target}"
        program = MeshfuserProgram(sub, name, mesh)
        setattr(fused, node.target, program)
        report.partitions.append((name, ops))
        report.programs.append(program)
    if mesh is None:
        reshape_views_of_programs(fused)
    else:
        from .placements import ANNOTATE, on_dtensors, redistribute
        for node in fused.graph.nodes:
            if node.op == "call_function" and node.target is ANNOTATE:
                node.target = redistribute
            elif node.op == "call_function" and node.target is not operator.getitem:
                node.target = on_dtensors(node.target, mesh)
    fused.recompile()
    _REPORTS.append(report)
    if dump_enabled():
        _log(report)
    return fused, report
