"""What a backend program runs on a GPU, known without one: each segment's pieces (a generated
kernel, or ATen and why), planned on meta tensors of the traced shapes and dtypes.

    for program in report.programs:          # meshfuser.dynamo.reports()
        for piece in gpu_pieces(program): ...

A piece's `kind`: "generated", "gemm" (cuBLAS through ATen), "attention" (PyTorch's fused kernels),
"views" (ATen views, no data moved) or "aten" (any other op ATen runs: the work to remove).
"""
import collections
import re

import torch

Piece = collections.namedtuple("Piece", "segment ops kind why")

_GEMM = {"linear", "matmul"}
_ATTENTION = {"sdpfa_fwd", "sdpfa_bwd"}
_PIECE = re.compile(r"^\s*piece \d+ \[(?P<ops>[^\]]*)\]: (?P<what>.*)$")
_SEGMENT = re.compile(r"^\s*segment (?P<n>\d+):$")


def _meta_inputs(program):
    from .importer import node_val
    vals = [node_val(n) for n in program._gm.graph.nodes if n.op == "placeholder"]
    return [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") for v in vals] + \
        [c.to("meta") for c in program._constants]


def _kind(ops, what):
    if what.startswith("generated"):
        return "generated"
    if set(ops) & _GEMM:
        return "gemm"
    if set(ops) & _ATTENTION:
        return "attention"
    if "only views" in what:
        return "views"
    return "aten"


def gpu_pieces(program):
    """[Piece] of a MeshfuserProgram (plain, not DTensor) on the GPU path, in program order."""
    program.fd.cuda_kernels(_meta_inputs(program))
    pieces, segment = [], None
    text = program.fd.host_program()
    for line in text[text.find("Segmentation"):].splitlines():
        m = _SEGMENT.match(line)
        if m:
            segment = int(m.group("n"))
            continue
        m = _PIECE.match(line)
        if m:
            ops = [o.strip() for o in m.group("ops").split(",")]
            what = m.group("what")
            why = what[len("ATen ("):-1] if what.startswith("ATen (") else what
            pieces.append(Piece(segment, ops, _kind(ops, what), why))
    return pieces


def aten_work(pieces):
    """Counter of the ops ATen runs outside GEMMs, attention and views: {op: pieces}."""
    return collections.Counter(op for p in pieces if p.kind == "aten" for op in p.ops)


def describe(program):
    """One line per piece that is neither a generated kernel nor views (for reports)."""
    return [f"  segment {p.segment} [{', '.join(p.ops)}]: {p.kind}" + ("" if p.kind in ("gemm", "attention")
                                                                         else f" ({p.why})")
            for p in gpu_pieces(program) if p.kind not in ("generated", "views")]


def copied_outputs(program):
    """The program's outputs that are views inside it: a program's outputs are new row-major
    tensors, so each is a copy (edge_views.py keeps them out)."""
    import operator
    from .aten_ops import VIEW_OPS
    (out,) = [n for n in program._gm.graph.nodes if n.op == "output"]
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return [n.name for n in values if n.op == "call_function" and n.target in VIEW_OPS and n.target is not operator.getitem and n.args
            and hasattr(n.args[0], "op")]
