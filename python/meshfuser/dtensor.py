"""DTensor interop.

`meshfuser.dtensor.compile(define_fn)` turns a single-device definition into a function of DTensors:
the sharding schedule of every input is derived from its placements, meshfuser's propagation decides
everything else, and the outputs come back as DTensors on the inputs' torch DeviceMesh.

`fd.execute(inputs)` of an already scheduled definition also accepts DTensors
(`execute_with_dtensors`, in meshfuser.dtensor_placements with the mapping helpers, which
fusion_definition imports without importing this module): their meshes and placements must match
the fusion inputs' shardings.

Mapping (for a torch mesh of k <= 3 dims): mesh dim k-1 (the last) <-> mesh_x, k-2 <-> mesh_y,
k-3 <-> mesh_z; the meshfuser mesh is `DeviceMesh(dtensor.device_mesh.mesh)`.
`Shard(d)` on mesh dim i <-> an outer split of tensor axis d by that mesh dim's size, the outer part
parallelized on the mesh dim's parallel type. `Replicate()` <-> no split. One tensor axis sharded on
several mesh dims (e.g. `[Shard(0), Shard(0)]`) becomes nested outer splits, mesh dim 0's outermost
(DTensor's order). A `define_tensor` without `dtype=` takes its DTensor's dtype.

Decisions:
* `Partial()` inputs are reduced first: `dt.redistribute(dt.device_mesh, [Replicate() if Partial else p])`
  (the reduction is done by torch, with the Partial's own reduce op); the fusion sees the replicated
  value. A fusion input can't be "partial", so this is the only faithful reading.
* Uneven shards (an extent not divisible by the mesh size) are refused with `meshfuser.ArgumentError`.
* Every tensor input must be a DTensor once one is; Python scalars may be mixed in.
* Outputs get no annotation at all: meshfuser's propagation chooses their mesh and sharding (a mesh
  without a split would mean "replicated" to meshfuser and force Allgathers).
* `compile(...)(*dtensors)` returns the single output DTensor, or a tuple when there are several.
* Expert parallelism (`compile(define, expert_parallel="ep")`, a mesh dim name or index): a DTensor
  with `Shard(0)` on that mesh dim (tokens split over the data-parallel ranks, expert weights split
  on their expert axis) is a rank-local input: the definition sees this rank's block (define it with
  -1 or the block's extents), and `fd.ops.all_to_all_dispatch(tokens, counts)` exchanges along that
  mesh dim (`fd.expert_mesh`, `fd.expert_axis`). Outputs are `Shard(0)` on it (rank-local rows or
  experts, stacked in rank order), or `Partial()` for the indices in `partial_outputs` (a
  replicated parameter's gradient from this rank's tokens: its share of the sum).
"""
from . import _C
from .dtensor_placements import (_check_inputs, _is_dtensor, _mesh_ranks, _normalized, _parallel_type,
                                 _placement_str, _resolve_partials, _torch, execute_with_dtensors)
from .dtensor_experts import _execute_expert_parallel, _expert_mesh_dim, _rank_local_inputs
from .fusion_definition import FusionDefinition
from .mesh import DeviceMesh

__all__ = ["compile", "CompiledFunction", "execute_with_dtensors"]


# -- 1. compile -------------------------------------------------------------------------------------

def _schedule_input(tv, mesh, placements):
    """Outer-split each sharded tensor axis by its mesh dim's size and parallelize the outer part.
    Axes are handled from the highest to the lowest, so the loop position of tensor axis d is still d
    when it is split (the inputs' loop domains start equal to their logical domains)."""
    _, _, Shard, _, _ = _torch()
    k = len(placements)
    by_axis = {}
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            by_axis.setdefault(p.dim, []).append(mesh_dim)
    tv.set_device_mesh(mesh)
    for axis in sorted(by_axis, reverse=True):
        pos = axis
        for mesh_dim in by_axis[axis]:  # lower mesh dim outermost, as in DTensor
            pt = _parallel_type(mesh_dim, k)
            tv.split(pos, mesh.size_of(pt), False)
            tv.parallelize(pos, pt)
            pos += 1


def _data_type(torch_dtype):
    torch = _torch()[0]
    table = {torch.float32: _C.DataType.Float, torch.float16: _C.DataType.Half, torch.bfloat16: _C.DataType.BFloat16,
             torch.float64: _C.DataType.Double, torch.int64: _C.DataType.Int, torch.int32: _C.DataType.Int32,
             torch.bool: _C.DataType.Bool}
    if torch_dtype not in table:
        raise _C.ArgumentError(f"meshfuser.dtensor.compile: dtype {torch_dtype} is not supported; "
                               f"supported: {', '.join(str(d) for d in table)}")
    return table[torch_dtype]


def _key(inputs, placements):
    key = []
    for t, pl in zip(inputs, placements):
        if pl is None:
            key.append(("scalar", type(t).__name__))
        else:
            key.append((_mesh_ranks(t.device_mesh), tuple(_placement_str(p) for p in pl), str(t.dtype),
                        tuple(t.shape)))
    return tuple(key)


class CompiledFunction:
    """The result of `compile(define_fn)`: call it with DTensors (and Python scalars)."""

    def __init__(self, define_fn, overlap=None, expert_parallel=None, partial_outputs=()):
        self._define_fn = define_fn
        self._overlap = overlap
        self._expert_parallel = expert_parallel
        self._partial_outputs = set(partial_outputs)
        FusionDefinition(overlap=overlap)  # unknown modes raise here, not at the first call
        self._cache = {}
        self.__doc__ = getattr(define_fn, "__doc__", None)
        self.__name__ = getattr(define_fn, "__name__", "compiled")

    def num_compiled(self):
        """How many sharded definitions have been built (one per mesh/placements/dtypes/shapes)."""
        return len(self._cache)

    def definitions(self):
        """The sharded FusionDefinitions built so far."""
        return list(self._cache.values())

    def __call__(self, *inputs):
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
            inputs = tuple(inputs[0])
        return self.run(list(inputs))

    def run(self, inputs, release_inputs=False):
        """Calls the function on the list `inputs`; release_inputs=True hands them over as
        FusionDefinition.execute(release_inputs=True) does (the list is emptied, each tensor is
        dropped after its last use). The expert-parallel path holds its inputs to the end."""
        given = inputs
        inputs = list(inputs)
        _check_inputs(inputs, "meshfuser.dtensor.compile")
        inputs = _resolve_partials(inputs)
        placements = [_normalized(i, t) if _is_dtensor(t) else None for i, t in enumerate(inputs)]
        expert_dim = None if self._expert_parallel is None else _expert_mesh_dim(inputs, self._expert_parallel)
        local_inputs = [] if expert_dim is None else _rank_local_inputs(inputs, placements, expert_dim)
        key = _key(inputs, placements)
        fd = self._cache.get(key)
        if fd is None:
            fd = self._build(inputs, placements, expert_dim, local_inputs)
            self._cache[key] = fd
        if expert_dim is None:
            if release_inputs:
                given.clear()
            outputs = fd.execute(inputs, release_inputs=release_inputs)
        else:
            outputs = _execute_expert_parallel(fd, inputs, local_inputs, expert_dim, self._partial_outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _build(self, inputs, placements, expert_dim=None, local_inputs=()):
        fd = FusionDefinition(overlap=self._overlap)
        # A define_tensor without a dtype takes its input's (bf16 DTensors need no dtype= in the definition).
        fd._input_dtypes = [_data_type(t.dtype) if pl is not None else None for t, pl in zip(inputs, placements)]
        if expert_dim is not None:
            torch_mesh = next(t.device_mesh for t in inputs if _is_dtensor(t))
            fd.expert_mesh = DeviceMesh(torch_mesh.mesh)
            fd.expert_axis = _parallel_type(expert_dim, torch_mesh.ndim)
        with fd:
            self._define_fn(fd)
        fusion = fd.fusion
        if fusion.num_inputs() != len(inputs):
            raise _C.ArgumentError(
                f"{self.__name__}: the definition has {fusion.num_inputs()} inputs; got {len(inputs)}")
        meshes = {}
        Replicate = _torch()[3]
        for i, (t, pl) in enumerate(zip(inputs, placements)):
            if pl is None:
                if fusion.input_is_tensor(i):
                    raise _C.ArgumentError(f"input {i}: the definition expects a tensor; got {type(t).__name__}")
                continue
            if not fusion.input_is_tensor(i):
                raise _C.ArgumentError(f"input {i}: the definition expects a scalar; got a DTensor")
            tv = fusion.input(i)
            if tv.ndim != t.ndim:
                raise _C.ArgumentError(f"input {i}: the definition has {tv.ndim} dims; the DTensor has {t.ndim}")
            local = i in local_inputs
            if local:  # rank-local: the definition sees this rank's block along the expert mesh dim
                pl = [Replicate() if mesh_dim == expert_dim else p for mesh_dim, p in enumerate(pl)]
            shape = list(t.shape)
            if local:
                shape[0] //= t.device_mesh.size(expert_dim)
            for axis, (want, got) in enumerate(zip(tv.shape, shape)):
                if want != -1 and want != got:
                    what = "this rank's block of the DTensor has extent" if local else "the DTensor's global extent is"
                    raise _C.ArgumentError(f"input {i}: axis {axis} is defined with extent {want}; {what} {got}")
            ranks = _mesh_ranks(t.device_mesh)
            if ranks not in meshes:
                meshes[ranks] = DeviceMesh(t.device_mesh.mesh)
            mesh = meshes[ranks]
            _schedule_input(tv, mesh, pl)
        if len(meshes) > 1:
            raise _C.ArgumentError(
                f"{self.__name__}: the DTensor inputs live on {len(meshes)} different device meshes "
                f"{[list(r[0]) for r in meshes]}; use one mesh")
        # Outputs are left unannotated: meshfuser's sharding propagation gives them the mesh and the
        # sharding (column parallel -> Shard(n), a sharded contraction -> Allreduce -> Replicate).
        # `set_device_mesh` alone would pin them as *replicated* on the mesh (meshfuser reads "mesh,
        # no DID" as Replicate) and force Allgathers of the inputs instead.
        return fd


def compile(define_fn, backward=None, num_outputs=1, overlap=None, expert_parallel=None, partial_outputs=()):
    """`define_fn(fd)` defines a single-device fusion (global shapes, -1 allowed). The result, called
    with DTensors, builds (once per meshes, placements, dtypes and global shapes) and runs a sharded
    definition, returning DTensors. `overlap` ("auto", "ring", "chunked" or None) overlaps the
    communication of each sharded linear with its GEMM (FusionDefinition.overlap).

    With `backward=define_backward`, the result is differentiable by torch.autograd: the forward's
    first `num_outputs` outputs are returned, the rest saved for the backward definition (see
    meshfuser.dtensor_autograd for the input and output conventions).

    `expert_parallel` (a mesh dim name or index) makes inputs with Shard(0) on that mesh dim
    rank-local and the outputs Shard(0) on it, except `partial_outputs` (indices), which are
    Partial() (see the module docstring)."""
    if backward is None:
        return CompiledFunction(define_fn, overlap, expert_parallel, partial_outputs)
    if expert_parallel is not None:
        raise _C.ArgumentError("compile: expert_parallel takes a definition computing its gradients itself "
                               "(one training definition), not backward=")
    from .dtensor_autograd import TrainableFunction
    return TrainableFunction(CompiledFunction(define_fn, overlap), CompiledFunction(backward, overlap), num_outputs)
