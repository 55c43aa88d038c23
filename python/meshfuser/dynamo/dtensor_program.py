"""DTensor graphs as global programs.

A Dynamo graph of a `parallelize_module`d model takes DTensor parameters (and the DeviceMesh) and
calls `DTensor.from_local`, `redistribute` and `to_local` where the parallel styles put them. We do
not replay DTensor's per-op decisions. The graph is rewritten into the *global* program:

* every DTensor input is a tensor of its global shape whose placements are its sharding; a plain
  input that the graph hands to `from_local` is one too (its global shape is the local one times
  the shard counts), any other plain input is replicated;
* `from_local` of an intermediate, `to_local` and `redistribute` become `meshfuser::annotate`
  (placements.py): the sharding the user's code asks for at that point;
* the mesh inputs disappear.

That program is traced by AOTAutograd on fake tensors of the global shapes (a joint forward and
backward graph, split by its default partitioner; or one inference graph), each graph partitioned
into meshfuser programs (whose sharding meshfuser propagates from the inputs' placements and the
annotations, planning the communications) and ATen ops run on DTensors. At run time the values are
DTensors; a torch.autograd.Function joins the two graphs, gradients of DTensor inputs come back with
the inputs' placements, and outputs are what the original graph returned (local tensors after a
`to_local`, DTensors with the traced placements otherwise).
"""
import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_export_joint_simple
from torch._functorch.partitioners import default_partition
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from .. import _C
from ..dtensor import _schedule_input
from ..mesh import DeviceMesh
from .aten_ops import TABLE
from .attention import flash_first, prepare_attention
from .graph_rewrites import decompositions as _decompositions, transpose_products, use_linear
from . import local_regions
from .importer import node_val
from .partition import partition
from .placements import ANNOTATE, gradient_placements, normalized, spec, spec_id


def _annotate(b, x, spec_index, grad_spec=-1):
    """The translation of meshfuser::annotate: a set whose output has the placements."""
    torch_mesh, placements = spec(spec_index)
    y = b.ops.set(x)
    _schedule_input(y, DeviceMesh(torch_mesh.mesh), list(placements))
    return y


TABLE[ANNOTATE] = _annotate


def has_dtensors(gm, example_inputs):
    return any(isinstance(x, DTensor) for x in example_inputs) or any(
        isinstance(node_val(n), DTensor) for n in gm.graph.nodes)


def compile_dtensor_graph(gm, example_inputs):
    return GlobalProgram(gm, example_inputs)


def _name(node):
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _is_dtensor_call(node, name):
    return node.op in ("call_method", "call_function") and _name(node) == name


class GlobalProgram:
    """What the backend returns for a DTensor graph: called with the graph's original inputs."""

    def __init__(self, gm: fx.GraphModule, example_inputs):
        # A copy: Dynamo calls us with the inputs of the graph it gave us, which must stay as it is.
        graph = fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        gm = self.gm = fx.GraphModule(gm, graph)
        self.kinds = []        # per placeholder: "dtensor", "local", "plain", "scalar" or "mesh"
        self.local_specs = {}  # placeholder index -> (mesh, placements) of a plain input made DTensor
        self.mesh = None
        self._compiled = {}    # (grad mode, input shapes, scalars) -> (forward, backward, differentiable)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        meshes = {}
        for i, (node, ex) in enumerate(zip(placeholders, example_inputs)):
            if isinstance(ex, TorchMesh) or isinstance(node_val(node), TorchMesh):
                meshes[node] = ex if isinstance(ex, TorchMesh) else node_val(node)
                self.kinds.append("mesh")
            elif isinstance(ex, DTensor):
                self._use_mesh(ex.device_mesh)
                self.kinds.append("dtensor")
            elif isinstance(ex, torch.Tensor):
                self.kinds.append("plain")
            elif isinstance(ex, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
                self.kinds.append("scalar")  # a size Dynamo made symbolic: its value specializes the program
            else:
                raise _C.ArgumentError(
                    f"torch.compile(backend='meshfuser'): input {i} ({node.name}) of a DTensor graph is a "
                    f"{type(ex).__name__}; meshfuser takes tensors, DTensors, numbers and the DeviceMesh")
        out = next(n for n in gm.graph.nodes if n.op == "output")
        returned = [node_val(o) if isinstance(o, fx.Node) else None for o in out.args[0]]
        self._rewrite(placeholders, meshes)
        self.outputs = self._output_kinds(returned)

    def _use_mesh(self, mesh):
        if self.mesh is None:
            self.mesh = mesh
        elif mesh is not self.mesh and mesh.mesh.tolist() != self.mesh.mesh.tolist():
            raise _C.ArgumentError(
                f"torch.compile(backend='meshfuser'): the graph uses two device meshes ({self.mesh.mesh.tolist()} "
                f"and {mesh.mesh.tolist()}); meshfuser's DTensor programs take one")

    # -- the global program ---------------------------------------------------------------------
    def _rewrite(self, placeholders, meshes):
        graph = self.gm.graph
        index = {n: i for i, n in enumerate(placeholders)}
        for node in list(graph.nodes):
            if _is_dtensor_call(node, "from_local"):
                x, mesh_node = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs["device_mesh"]
                mesh = meshes[mesh_node]
                self._use_mesh(mesh)
                val = node_val(node)
                placements = normalized(val.placements, val.ndim)
                if x.op == "placeholder":
                    i = index[x]
                    if i in self.local_specs and self.local_specs[i][1] != placements:
                        raise _C.ArgumentError(
                            f"torch.compile(backend='meshfuser'): input {i} ({x.name}) is made a DTensor twice "
                            f"with different placements")
                    self.kinds[i] = "local"
                    self.local_specs[i] = (mesh, placements)
                    node.replace_all_uses_with(x)
                else:
                    self._replace(node, x, mesh, placements, placements)
            elif _is_dtensor_call(node, "to_local"):
                val = node_val(node.args[0])
                placements = normalized(val.placements, val.ndim)
                self._replace(node, node.args[0], val.device_mesh, placements, placements).meta["mf_to_local"] = True
            elif _is_dtensor_call(node, "redistribute") or _is_dtensor_call(node, "full_tensor"):
                val, before = node_val(node), node_val(node.args[0])
                placements = normalized(val.placements, val.ndim) if isinstance(val, DTensor) else \
                    (Replicate(),) * self.mesh.ndim
                self._replace(node, node.args[0], self.mesh, placements, normalized(before.placements, before.ndim))
        # One annotation per value and placements: the q, k and v projections of a sequence-parallel
        # layer each redistribute the same normed input; one gathered copy serves all three.
        seen = {}
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is ANNOTATE:
                key = (node.args[0], node.args[1], node.args[2])
                if key in seen:
                    node.replace_all_uses_with(seen[key])
                    graph.erase_node(node)
                else:
                    seen[key] = node
        for node in reversed(list(graph.nodes)):
            if node.op not in ("placeholder", "output") and not node.users:
                graph.erase_node(node)
        for node in list(graph.nodes):
            if node.op == "placeholder" and node in meshes and not node.users:
                graph.erase_node(node)
        for node in placeholders:
            if node in meshes and node.users:
                raise _C.ArgumentError(
                    f"torch.compile(backend='meshfuser'): the DeviceMesh input {node.name} is used by "
                    f"{[u.format_node() for u in node.users]}; meshfuser's DTensor programs take the mesh "
                    "only in DTensor.from_local")
        if self.mesh is None:
            raise _C.InternalError("a DTensor graph without a mesh")
        self.gm.recompile()

    def _replace(self, node, x, mesh, placements, grad_placements):
        """node (a from_local, to_local or redistribute of x) -> annotate(x, placements), its gradient
        annotated with grad_placements (none where they are Partial: any sharding will do)."""
        self._use_mesh(mesh)
        spec_index = spec_id(self.mesh, placements)
        grad_spec = -1 if any(isinstance(p, Partial) for p in grad_placements) else \
            spec_id(self.mesh, gradient_placements(grad_placements))
        if isinstance(x, fx.Node) and x.target is ANNOTATE and x.args[1] == spec_index:
            node.replace_all_uses_with(x)  # to_local after a redistribute to the same placements
            self.gm.graph.erase_node(node)
            return x
        with self.gm.graph.inserting_before(node):
            new = self.gm.graph.call_function(ANNOTATE, (x, spec_index, grad_spec))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        self.gm.graph.erase_node(node)
        return new

    def _output_kinds(self, returned):
        """Per graph output: ("dtensor", placements, shape) for a DTensor the graph returned,
        ("local", placements, local shape) for a to_local, ("plain", None, local shape) for other
        tensors computed from local ones."""
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        kinds = []
        for o, original in zip(out.args[0], returned):
            is_dtensor = isinstance(original, DTensor)
            val = node_val(o) if isinstance(o, fx.Node) else None
            if isinstance(o, fx.Node) and o.target is ANNOTATE:
                placements = spec(o.args[1])[1]
            elif isinstance(val, DTensor):
                placements = normalized(val.placements, val.ndim)
            else:
                placements = None
            kinds.append(("dtensor" if is_dtensor else "local" if placements else "plain", placements,
                          tuple(original.shape) if isinstance(original, torch.Tensor) and not is_dtensor else None))
        return kinds

    # -- compiling ------------------------------------------------------------------------------
    def _global_inputs(self, args):
        fake_mode = FakeTensorMode()
        fakes = []
        for kind, a in zip(self._kinds_in_graph(), args):
            shape = list(a.shape)
            device = a.to_local().device if isinstance(a, DTensor) else a.device
            with fake_mode:
                t = torch.empty(shape, dtype=a.dtype, device=device)
            fakes.append(t.requires_grad_(a.requires_grad))
        return fakes

    def _kinds_in_graph(self):
        return [k for k in self.kinds if k not in ("mesh", "scalar")]

    def _specialized(self, scalars):
        """The global program with the scalar inputs (sizes Dynamo made symbolic) replaced by values."""
        if not scalars:
            return self.gm
        graph = fx.Graph()
        graph.output(graph.graph_copy(self.gm.graph, {}))
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        kinds = [k for k in self.kinds if k != "mesh"]
        values = iter(scalars)
        for node, kind in zip(placeholders, kinds):
            if kind == "scalar":
                node.replace_all_uses_with(next(values))
                graph.erase_node(node)
        return fx.GraphModule(self.gm, graph)

    def _compile(self, args, scalars, needs_grad):
        fakes = self._global_inputs(args)
        program = self._specialized(scalars)
        local_regions.check(program, fakes, fake_tensor_mode_of(fakes))
        decompositions = _decompositions()
        n_out = len(self.outputs)
        if not needs_grad:
            with flash_first():
                graph = aot_export_joint_simple(program, fakes, trace_joint=False, decompositions=decompositions)
            return partition(_prepare(graph), "inference", self.mesh)[0], None, None
        with flash_first():
            joint = aot_export_joint_simple(program, fakes, trace_joint=True, decompositions=decompositions)
        fw, bw = default_partition(joint, fakes, num_fwd_outputs=n_out)
        tangents = [n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
        with fake_tensor_mode_of(fakes):
            traced = program(*fakes)
        differentiable = [isinstance(t, torch.Tensor) and t.requires_grad for t in traced]
        if sum(differentiable) != len(tangents):
            raise _C.InternalError(f"meshfuser.dynamo: {len(tangents)} tangents for {sum(differentiable)} "
                                   "differentiable outputs")
        forward = partition(_prepare(fw), "forward", self.mesh)[0]
        backward = partition(_prepare(bw), "backward", self.mesh)[0]
        return forward, backward, differentiable

    # -- running --------------------------------------------------------------------------------
    def _dtensor_inputs(self, args):
        inputs, scalars = [], []
        for i, (kind, a) in enumerate(zip(self.kinds, args)):
            if kind == "mesh":
                continue
            if kind == "scalar":
                scalars.append(a)
                continue
            if kind == "local":
                mesh, placements = self.local_specs[i]
                a = DTensor.from_local(a, mesh, placements, run_check=False)
            elif kind == "plain":
                a = DTensor.from_local(a, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)
            inputs.append(a)
        return inputs, scalars

    def __call__(self, *args):
        inputs, scalars = self._dtensor_inputs(args)
        needs_grad = torch.is_grad_enabled() and any(a.requires_grad for a in inputs)
        key = (needs_grad, tuple(tuple(a.shape) for a in inputs), tuple(scalars))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = torch._dynamo.disable(self._compile)(inputs, scalars, needs_grad)
        forward, backward, differentiable = compiled
        if backward is None:
            results = forward(*inputs)
        else:
            results = _GlobalFunction.apply(self, forward, backward, differentiable, *inputs)
        return tuple(self._finish(r, kind) for r, kind in zip(results, self.outputs))

    @staticmethod
    def _finish(result, kind):
        what, placements, shape = kind
        if not isinstance(result, DTensor):
            return result
        if placements is not None and tuple(result.placements) != tuple(placements):
            result = result.redistribute(result.device_mesh, placements)
        if what == "dtensor":
            return result
        local = result.to_local()
        if shape is not None and all(isinstance(n, int) for n in shape) and tuple(local.shape) != shape:
            raise _C.Error(
                f"torch.compile(backend='meshfuser'): an output computed from local tensors (after to_local) has "
                f"the local shape {tuple(local.shape)} in meshfuser's global program but {shape} in eager; "
                f"return the DTensor, or call to_local() last")
        return local


def _prepare(gm):
    return transpose_products(use_linear(prepare_attention(gm)))


def fake_tensor_mode_of(fakes):
    return fakes[0].fake_mode if fakes else FakeTensorMode()


class _GlobalFunction(torch.autograd.Function):
    """The forward and backward graphs of a global program on DTensors."""

    @staticmethod
    def forward(ctx, program, forward, backward, differentiable, *inputs):
        results = forward(*inputs)
        n = len(differentiable)
        outs, saved = results[:n], results[n:]
        ctx.backward_graph = backward
        ctx.save_for_backward(*saved)
        ctx.inputs_meta = [(t.device_mesh, gradient_placements(t.placements)) if isinstance(t, DTensor) else None
                           for t in inputs]
        ctx.differentiable = differentiable
        ctx.outs_like = [(o.device_mesh, o.placements, o.to_local().shape, o.shape, o.stride(), o.to_local().dtype,
                          o.to_local().device) if isinstance(o, DTensor) else None for o in outs]
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, differentiable) if not d and isinstance(o, torch.Tensor)])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        tangents = []
        for g, d, like in zip(grads, ctx.differentiable, ctx.outs_like):
            if not d:
                continue
            if g is None:
                mesh, placements, local_shape, shape, stride, dtype, device = like
                g = DTensor.from_local(torch.zeros(local_shape, dtype=dtype, device=device), mesh, placements,
                                       shape=shape, stride=stride, run_check=False)
            tangents.append(g)
        grads_in = ctx.backward_graph(*ctx.saved_tensors, *tangents)
        out = []
        for g, meta in zip(grads_in, ctx.inputs_meta):
            if g is not None and meta is not None and isinstance(g, DTensor) and tuple(g.placements) != meta[1]:
                g = g.redistribute(meta[0], meta[1])
            out.append(g)
        return (None, None, None, None, *out)

