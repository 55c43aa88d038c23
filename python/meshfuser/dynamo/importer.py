"""One fx graph of ATen ops (a partition of an AOTAutograd graph) -> one meshfuser FusionDefinition.

Every placeholder becomes a fusion input with the shape and dtype recorded on it by tracing
(`node.meta["val"]`), every node one or a few meshfuser ops (aten_ops.TABLE), and the graph's outputs
the fusion's outputs. After each node the result's dtype is compared with the one eager PyTorch gives
(the traced value's) and cast where meshfuser's promotion differs, so outputs have eager's dtypes.
In a DTensor program the inputs' shardings come from their placements (meshfuser.dtensor.compile
schedules them) and the shardings inside from `meshfuser::annotate` nodes (dtensor_program.py).
"""
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import _C
from ..fusion_definition import FusionDefinition, TensorView
from .aten_ops import DTYPES, TABLE


def node_val(node):
    return node.meta.get("val", node.meta.get("example_value"))


class GraphImporter:
    """Builds the definition; translations (aten_ops) call back into it through `b`."""

    def __init__(self, gm: fx.GraphModule, name="meshfuser", fd=None):
        """Builds into `fd` when given (a definition being built, as meshfuser.dtensor.compile
        hands one to its define function), else into a new FusionDefinition."""
        self.gm = gm
        self.name = name
        self.fd = fd if fd is not None else FusionDefinition()
        self.ops = self.fd.ops
        self.values = {}            # fx.Node -> TensorView (or list of them)
        self.constants = []         # tensors appended to the inputs at every call (constant_input)
        self._shapes = {}           # TensorView -> static shape (list of int)
        self._dtypes = {}           # TensorView -> torch dtype
        self.node = None
        self.out_shape = None
        self.out_dtype = None
        self.device = None
        self.output_nodes = []
        # The local path keeps each output in eager's memory layout (the DTensor path's outputs are
        # local shards of global tensors, laid out by the program).
        self._eager_layouts = fd is None
        if fd is not None:
            self._build()
            return
        with self.fd:
            self._build()

    # -- helpers for translations ---------------------------------------------------------------
    def shape_of(self, tv):
        return self._shapes[tv] if tv in self._shapes else list(tv.shape)

    def dtype_of(self, tv):
        return self._dtypes[tv]

    def constant_input(self, tensor):
        """A fusion input fed with `tensor` at every call."""
        tv = self.fd.define_tensor(list(tensor.shape), dtype=DTYPES[tensor.dtype])
        self._record(tv, tensor)
        self.constants.append(tensor)
        return tv

    def _record(self, tv, val):
        self._shapes[tv] = [int(s) for s in val.shape]
        self._dtypes[tv] = val.dtype

    # -- building -------------------------------------------------------------------------------
    def _build(self):
        # Placeholders first: constant inputs (made while translating) come after every one of them.
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                val = node_val(node)
                tv = self.fd.define_tensor([int(s) for s in val.shape], dtype=DTYPES[val.dtype])
                self._record(tv, val)
                self.values[node] = tv
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "call_function":
                self.values[node] = self._translate(node)
            elif node.op == "output":
                self._outputs(node.args[0])
            else:
                raise _C.InternalError(f"meshfuser.dynamo: unexpected {node.op} node {node.name} in a partition")

    @staticmethod
    def _device(node, val):
        for v in [val] + [node_val(a) for a in node.all_input_nodes]:
            if isinstance(v, torch.Tensor):
                return v.device
            if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
                return v[0].device
        return torch.device("cpu")

    def _arg(self, a):
        if isinstance(a, fx.Node):
            return self.values[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def _translate(self, node):
        self.node = node
        val = node_val(node)
        is_tensor = isinstance(val, torch.Tensor)
        self.out_shape = [int(s) for s in val.shape] if is_tensor else None
        self.out_dtype = val.dtype if is_tensor else None
        self.device = self._device(node, val)
        args = [self._arg(a) for a in node.args]
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        result = TABLE[node.target](self, *args, **kwargs)
        return self._conform(result, val)

    def _conform(self, result, val):
        """Record the traced shape and dtype; cast where meshfuser's dtype differs from eager's."""
        if isinstance(result, (list, tuple)):
            return [self._conform(r, v) for r, v in zip(result, val)]
        if not isinstance(result, TensorView) or not isinstance(val, torch.Tensor):
            return result
        if result.dtype != DTYPES[val.dtype]:
            result = self.ops.cast(result, DTYPES[val.dtype])
        self._record(result, val)
        return result

    def _outputs(self, out):
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        self.single_output = not isinstance(out, (list, tuple))
        added = {}
        for o in outs:
            tv = self.values[o]
            if tv in added:  # the same value twice: one fusion output, returned twice
                self.output_nodes.append(added[tv])
                continue
            if self._is_input(tv):  # an input returned as it is: a copy, as a fusion output is new
                tv = self.ops.set(tv)
            if self._eager_layouts:
                _keep_layout(tv, node_val(o))
            self.fd.add_output(tv)
            added[self.values[o]] = len(added)
            self.output_nodes.append(added[self.values[o]])

    def _is_input(self, tv):
        return any(tv is self.values[n] for n in self.gm.graph.nodes if n.op == "placeholder")


def _keep_layout(tv, val):
    """A dense output that eager lays out other than row-major (attention's [b, h, s, d] output
    written [b, s, h, d]-major, as the kernels write it) keeps that layout: a fusion output is
    otherwise made contiguous, a copy eager does not make (the attention output returned and saved
    for the backward, which then met its gradient in the other layout; CPU profile: 2 forward copies
    -> 0). Suspected, not yet measured on a GPU, to be the HF Llama step's 0.19 ms strided copy."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.is_contiguous():
        return
    try:
        sizes, strides = [int(s) for s in val.shape], [int(s) for s in val.stride()]
    except (TypeError, ValueError):  # symbolic: the layout is decided per call
        return
    order = sorted(range(len(sizes)), key=lambda d: (-strides[d], d))  # outermost first
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return  # not a permutation of a dense layout (an expanded or sliced view)
        expected *= sizes[d]
    tv.set_allocation_domain(order)


class MeshfuserProgram(torch.nn.Module):
    """A partition run by meshfuser: called with the partition's inputs, returns its outputs as the
    fx submodule did (one value, or a tuple).

    With `mesh` (a torch DeviceMesh: the partition belongs to a DTensor program) the inputs are
    DTensors of the global program, and the definition is built per placements of the inputs by
    meshfuser.dtensor.compile (the shardings of the inputs come from their placements, annotations
    inside from `meshfuser::annotate`); constants are replicated on `mesh`."""

    def __init__(self, gm: fx.GraphModule, name, mesh=None):
        super().__init__()
        self.name = name
        self.mesh = mesh
        self._gm = gm
        # Built inside the compiler, where AOTAutograd's fake mode is active: constants made while
        # translating must be real tensors. Built once here in any case: translation errors show at
        # compile time, and the constants and output order are known.
        with unset_fake_temporarily():
            self.importer = GraphImporter(gm, name)
        self.fd = self.importer.fd
        self._constants = self.importer.constants
        if mesh is not None:
            from ..dtensor import CompiledFunction
            from torch.distributed.tensor import DTensor, Replicate
            self._constants = [DTensor.from_local(c, mesh, [Replicate()] * mesh.ndim, run_check=False)
                               for c in self._constants]
            self._compiled = CompiledFunction(self._define)
            self._compiled.__name__ = name

    def _define(self, fd):
        with unset_fake_temporarily():
            self.last_importer = GraphImporter(self._gm, self.name, fd=fd)

    def definitions(self):
        """The FusionDefinitions this partition ran (one, or one per placements of DTensor inputs)."""
        return [self.fd] if self.mesh is None else self._compiled.definitions()

    def forward(self, *args):
        inputs = list(args) + self._constants
        if self.mesh is None:
            outputs = self.fd.execute(inputs)
        else:
            from .placements import replicated
            outputs = self._compiled(*[replicated(x, self.mesh) for x in inputs])
            outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        picked = [outputs[i] for i in self.importer.output_nodes]
        return picked[0] if self.importer.single_output else tuple(picked)

    def __repr__(self):
        return f"MeshfuserProgram({self.name})"
