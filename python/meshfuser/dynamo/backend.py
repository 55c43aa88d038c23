"""The torch.compile backend: Dynamo's graph -> AOTAutograd (forward, backward, inference graphs of
ATen ops) -> each graph partitioned into meshfuser programs and eager ATen nodes.

Graphs whose inputs include DTensors take the global-program path (dtensor_program.py): the graph is
traced again on plain tensors of the global shapes, and the placements become shardings.
"""
import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from .attention import flash_first, prepare_attention
from .graph_rewrites import decompositions, use_linear
from .partition import partition


def _compiler(kind, counter):
    def compile_graph(gm, example_inputs):
        counter[kind] = counter.get(kind, 0) + 1
        title = kind if counter[kind] == 1 else f"{kind}{counter[kind]}"
        gm = use_linear(prepare_attention(gm))
        gm, _report = partition(gm, title)
        return make_boxed_func(gm.forward)
    return compile_graph


def _compile(gm, example_inputs):
    counter = {}
    with flash_first():
        return aot_autograd(fw_compiler=_compiler("forward", counter), bw_compiler=_compiler("backward", counter),
                            inference_compiler=_compiler("inference", counter),
                            decompositions=decompositions())(gm, example_inputs)


def _symbolic(example_inputs):
    return any(isinstance(x, (torch.SymInt, torch.SymFloat)) or (
        isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape)) for x in example_inputs)


class PerShape:
    """A graph Dynamo traced with symbolic shapes (after a call with new sizes): meshfuser programs
    have static shapes here, so the graph is compiled once per set of input sizes (and grad mode)
    at its first call with them. Programs keep kernels across sizes by shape class (docs/design.md section 10)."""

    def __init__(self, gm):
        self.gm = gm
        self.compiled = {}

    def __call__(self, *args):
        key = (torch.is_grad_enabled(),) + tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = torch._dynamo.disable(_compile)(self.gm, list(args))
        return fn(*args)


def backend(gm: fx.GraphModule, example_inputs):
    """torch.compile(model, backend="meshfuser") or backend=meshfuser.dynamo.backend."""
    from .dtensor_program import has_dtensors, compile_dtensor_graph
    if has_dtensors(gm, example_inputs):
        return compile_dtensor_graph(gm, example_inputs)
    if _symbolic(example_inputs):
        return PerShape(gm)
    return _compile(gm, example_inputs)
