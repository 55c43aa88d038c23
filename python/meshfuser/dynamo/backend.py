"""The torch.compile backend: Dynamo's graph -> AOTAutograd (forward, backward, inference graphs of
ATen ops) -> each graph partitioned into meshfuser programs and eager ATen nodes.

Graphs whose inputs include DTensors take the global-program path (dtensor_program.py): the graph is
traced again on plain tensors of the global shapes, and the placements become shardings.
"""
import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from .. import _C
from .attention import flash_first, prepare_attention
from .attention_masks import attention_as_meant
from .graph_rewrites import decompositions, transpose_products, use_linear
from .partition import partition
from .sink_permutes import sink_permutes


def _compiler(kind, counter):
    def compile_graph(gm, example_inputs):
        counter[kind] = counter.get(kind, 0) + 1
        title = kind if counter[kind] == 1 else f"{kind}{counter[kind]}"
        gm = sink_permutes(transpose_products(use_linear(prepare_attention(gm))))
        gm, _report = partition(gm, title)
        return make_boxed_func(gm.forward)
    return compile_graph


def _compile(gm, example_inputs, recompute=True):
    """recompute: AOTAutograd's min-cut partitioner (Inductor's choice) saves for the backward
    what is costly to recompute and recomputes cheap pointwise work there (SiLU, RMSNorm's scaling,
    the RoPE tables): the forward writes fewer tensors (the MLP's SiLU joins its product in one
    kernel) and the backward's generated kernels read the saved inputs instead. False: the default
    partitioner, which saves every intermediate the backward reads."""
    counter = {}
    with flash_first():
        return aot_autograd(fw_compiler=_compiler("forward", counter), bw_compiler=_compiler("backward", counter),
                            inference_compiler=_compiler("inference", counter), decompositions=decompositions(),
                            partition_fn=min_cut_rematerialization_partition if recompute else default_partition)(
            gm, example_inputs)


def _symbolic(example_inputs):
    return any(isinstance(x, (torch.SymInt, torch.SymFloat)) or (
        isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape)) for x in example_inputs)


class PerShape:
    """A graph Dynamo traced with symbolic shapes (after a call with new sizes): meshfuser programs
    have static shapes here, so the graph is compiled once per set of input sizes (and grad mode)
    at its first call with them. Programs keep kernels across sizes by shape class (docs/design.md section 10)."""

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
