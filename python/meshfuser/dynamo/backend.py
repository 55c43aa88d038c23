"""The torch.compile backend: Dynamo's graph -> AOTAutograd (forward, backward, inference graphs of
ATen ops) -> each graph partitioned into meshfuser programs and eager ATen nodes.

Graphs whose inputs include DTensors take the global-program path (dtensor_program.py): the graph is
traced again on plain tensors of the global shapes, and the placements become shardings.
"""
import functools

import torch
import torch.fx as fx
from torch._decomp import get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from .. import _C

from .aten_ops import DECOMPOSE, aten
from .attention import flash_first, prepare_attention
from .attention_masks import attention_as_meant
from .partition import partition
from .sink_permutes import sink_permutes


def _is_transpose_2d(node):
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    val = node.meta.get("val")
    if val is None or val.dim() != 2:
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


def _compiler(kind, counter):
    def compile_graph(gm, example_inputs):
        counter[kind] = counter.get(kind, 0) + 1
        title = kind if counter[kind] == 1 else f"{kind}{counter[kind]}"
        gm = sink_permutes(use_linear(prepare_attention(gm)))
        gm, _report = partition(gm, title)
        return make_boxed_func(gm.forward)
    return compile_graph


@functools.lru_cache(maxsize=None)
def _decompositions():
    return get_decompositions(DECOMPOSE)


def _compile(gm, example_inputs, recompute=True):
    """recompute: AOTAutograd's min-cut partitioner (Inductor's choice) saves for the backward
    what is costly to recompute and recomputes cheap pointwise work there (SiLU, RMSNorm's scaling,
    the RoPE tables): the forward writes fewer tensors (the MLP's SiLU joins its product in one
    kernel) and the backward's generated kernels read the saved inputs instead. False: the default
    partitioner, which saves every intermediate the backward reads."""
    counter = {}
    with flash_first():
        return aot_autograd(fw_compiler=_compiler("forward", counter), bw_compiler=_compiler("backward", counter),
                            inference_compiler=_compiler("inference", counter), decompositions=_decompositions(),
                            partition_fn=min_cut_rematerialization_partition if recompute else default_partition)(
            gm, example_inputs)


def _symbolic(example_inputs):
    return any(isinstance(x, (torch.SymInt, torch.SymFloat)) or (
        isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape)) for x in example_inputs)


class PerShape:
    """A graph Dynamo traced with symbolic shapes (after a call with new sizes): meshfuser programs
    have static shapes here, so the graph is compiled once per set of input sizes (and grad mode)
    at its first call with them. Programs keep kernels across sizes by shape class (see the notes)."""

    def __init__(self, gm, recompute=True):
        self.gm = gm
        self.recompute = recompute
        self.compiled = {}

    def __call__(self, *args):
        key = (torch.is_grad_enabled(),) + tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = torch._dynamo.disable(_compile)(self.gm, list(args), self.recompute)
        return fn(*args)


OPTIONS = {"recompute": "min-cut partitioning between forward and backward (default True; see _compile)"}


def backend(gm: fx.GraphModule, example_inputs, options=None):
    """torch.compile(model, backend="meshfuser") or backend=meshfuser.dynamo.backend; `options`
    (torch.compile's options=) takes the keys of OPTIONS."""
    from .dtensor_program import has_dtensors, compile_dtensor_graph
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise _C.ArgumentError(f"torch.compile(backend='meshfuser', options=...): unknown option(s) {unknown}; "
                               f"the backend takes {sorted(OPTIONS)}")
    recompute = bool(options.get("recompute", True))
    gm = attention_as_meant(gm)
    if has_dtensors(gm, example_inputs):
        return compile_dtensor_graph(gm, example_inputs)
    if _symbolic(example_inputs):
        return PerShape(gm, recompute)
    return _compile(gm, example_inputs, recompute)
