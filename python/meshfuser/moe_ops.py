"""fd.ops for mixture-of-experts layers: the grouped GEMM and the routing ops.

PyTorch's semantics under nvFuser's names. Ops that take an axis and an index tensor accept both
PyTorch's argument order (x, dim, index[, src]) and nvFuser's (x, index[, src], dim): the axis is
the int, the index the TensorView.
"""
import numbers

from . import _C
from ._C import TensorView


def _dim_and_tensors(op, args):
    """(dim, tensors) from PyTorch's (dim, t..) or nvFuser's (t.., dim) order."""
    if args and isinstance(args[0], numbers.Integral) and not isinstance(args[0], bool):
        dim, tensors = int(args[0]), list(args[1:])
    elif args and isinstance(args[-1], numbers.Integral) and not isinstance(args[-1], bool):
        dim, tensors = int(args[-1]), list(args[:-1])
    else:
        raise _C.ArgumentError(f"{op}: expected an int axis (dim) and index tensors; got "
                               f"{[type(a).__name__ for a in args]}")
    for t in tensors:
        if not isinstance(t, TensorView):
            raise _C.ArgumentError(f"{op}: expected a TensorView; got {type(t).__name__}")
    return dim, tensors


def _team_size(mesh, axis):
    """Devices of `mesh` along `axis` (mesh_x: the last mesh axis)."""
    from ._C import ParallelType
    from .mesh import as_device_mesh
    mesh = as_device_mesh(mesh, "all_to_all_dispatch")
    position = {ParallelType.mesh_x: -1, ParallelType.mesh_y: -2, ParallelType.mesh_z: -3}.get(axis)
    if position is None or -position > len(mesh.shape):
        raise _C.ArgumentError(f"all_to_all_dispatch: mesh {mesh} has no axis {axis}")
    return mesh.shape[position]


class MoeOps:
    """Mixed into fd.ops (fusion_definition._Ops)."""

    def grouped_mm(self, mat1, mat2, offsets=None):
        """torch._grouped_mm: [m, k] x [g, k, n] with int32 ``offsets`` [g] (cumulative ends of
        each group's rows of mat1) gives [m, n]; [g, m, k] x [g, k, n] (offsets None) gives
        [g, m, n]; [m, k] x [k, n] with offsets splitting k gives [g, m, n] (a weight gradient).
        Runs PyTorch's grouped GEMM on CUDA bfloat16, one matmul per group elsewhere."""
        mat1, mat2 = self._tensor(mat1, "grouped_mm"), self._tensor(mat2, "grouped_mm")
        return _C.ops.grouped_mm(mat1, mat2, None if offsets is None else self._tensor(offsets, "grouped_mm"))

    def topk(self, x, k, dim=-1, largest=True, sorted=True):
        """torch.topk: (values, indices) of the k largest (or smallest) entries along dim;
        indices are int64."""
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise _C.ArgumentError(f"topk: k must be a Python int (a static count); got {type(k).__name__}")
        return _C.ops.topk(self._tensor(x, "topk"), int(k), int(dim), bool(largest), bool(sorted))

    def sort(self, x, dim=-1, descending=False, stable=False):
        """torch.sort: (values, indices) along dim; indices are int64."""
        return _C.ops.sort(self._tensor(x, "sort"), int(dim), bool(descending), bool(stable))

    def argsort(self, x, dim=-1, descending=False, stable=False):
        """torch.argsort: the int64 positions that sort x along dim (stable keeps ties in order)."""
        return _C.ops.argsort(self._tensor(x, "argsort"), int(dim), bool(descending), bool(stable))

    def index_select(self, x, *args):
        """torch.index_select(x, dim, index): the entries of axis dim named by the 1-D integer
        index (nvFuser's order index_select(x, index, dim) works too)."""
        dim, (index,) = _dim_and_tensors("index_select", args)
        return _C.ops.index_select(self._tensor(x, "index_select"), dim, index)

    def gather(self, x, *args):
        """torch.gather(x, dim, index): out[..i..] = x[..index[..i..]..] along dim; index has x's
        rank and at most x's extents on the other axes (nvFuser's gather(x, index, dim) too)."""
        dim, (index,) = _dim_and_tensors("gather", args)
        return _C.ops.gather(self._tensor(x, "gather"), dim, index)

    def take_along_axis(self, x, index, dim):
        """numpy's take_along_axis (nvFuser's): gather with index of x's extents on the other axes."""
        return _C.ops.gather(self._tensor(x, "take_along_axis"), int(dim), self._tensor(index, "take_along_axis"),
                             True)

    def scatter(self, x, *args):
        """torch.scatter(x, dim, index, src): a copy of x with src's values written at index along
        dim (nvFuser's scatter(x, index, src, dim) too)."""
        dim, (index, src) = _dim_and_tensors("scatter", args)
        return _C.ops.scatter(self._tensor(x, "scatter"), dim, index, src)

    def scatter_reduce(self, x, *args, reduce=None, include_self=True):
        """torch.scatter_reduce(x, dim, index, src, reduce, include_self=True): a copy of x where
        src's values reduce into the positions index names along dim; reduce is "sum", "prod",
        "mean", "amax" or "amin" (nvFuser's order (x, index, src, dim) works too)."""
        names = [a for a in args if isinstance(a, str)]
        if reduce is None and len(names) == 1:
            reduce = names[0]
        if reduce is None:
            raise _C.ArgumentError("scatter_reduce: expected reduce (\"sum\", \"prod\", \"mean\", \"amax\" or \"amin\")")
        dim, (index, src) = _dim_and_tensors("scatter_reduce", [a for a in args if not isinstance(a, str)])
        return _C.ops.scatter_reduce(self._tensor(x, "scatter_reduce"), dim, index, src, str(reduce),
                                     bool(include_self))

    def scatter_add(self, x, *args):
        """torch.scatter_add(x, dim, index, src): scatter_reduce with reduce="sum" (e.g. tokens per
        expert for each row of a batch: zeros, the expert ids and ones)."""
        return self.scatter_reduce(x, *args, reduce="sum")

    def index_add(self, x, *args):
        """torch.index_add(x, dim, index, src): a copy of x with the slices of src along dim added
        at the positions the 1-D index names (repeats accumulate): the weighted combine of a
        mixture-of-experts layer. nvFuser's order (x, index, src, dim) works too."""
        dim, (index, src) = _dim_and_tensors("index_add", args)
        return _C.ops.index_add(self._tensor(x, "index_add"), dim, index, src)

    def all_to_all_dispatch(self, tokens, counts, mesh=None, mesh_axis=None):
        """Expert-parallel token dispatch along a mesh axis (mesh_x unless given): this rank's rows
        ``tokens`` [m, ..], grouped by expert with ``counts`` [experts] rows per expert, go to the
        team member holding their expert (member r holds experts r*e..(r+1)*e-1, e = experts / team).
        Two communications: the counts' AllToAll, then the rows' AllToAllV with the split sizes the
        counts give. Returns (received, recv_counts): the rows for this rank's experts, grouped by
        local expert and then by source rank (their number is known only at run time), and
        recv_counts [team, e], the rows each source sent each local expert (sum over axis 0 and
        cumsum give grouped_mm's offsets). ``mesh``: the DeviceMesh (or the team size); under
        meshfuser.dtensor.compile(expert_parallel=...) the expert-parallel mesh and axis by default."""
        from ._C import ParallelType
        if mesh is None:
            mesh = getattr(self._fd, "expert_mesh", None)
            if mesh_axis is None:
                mesh_axis = getattr(self._fd, "expert_axis", None)
            if mesh is None:
                raise _C.ArgumentError("all_to_all_dispatch: expected the mesh to exchange on (a DeviceMesh or the "
                                       "team size)")
        axis = ParallelType.mesh_x if mesh_axis is None else mesh_axis
        team = mesh if isinstance(mesh, numbers.Integral) else _team_size(mesh, axis)
        return _C.ops.all_to_all_dispatch(self._tensor(tokens, "all_to_all_dispatch"),
                                          self._tensor(counts, "all_to_all_dispatch"), axis, int(team))

    def all_to_all_combine(self, expert_out, counts, recv_counts):
        """The reverse of all_to_all_dispatch(tokens, counts, ..) -> (received, recv_counts): the rows
        of ``expert_out`` (in the received rows' order) go back to their senders, which get them in
        the order of ``tokens`` (one AllToAllV)."""
        return _C.ops.all_to_all_combine(self._tensor(expert_out, "all_to_all_combine"),
                                         self._tensor(counts, "all_to_all_combine"),
                                         self._tensor(recv_counts, "all_to_all_combine"))

    def cumsum(self, x, dim, dtype=None):
        """torch.cumsum; integer and bool inputs accumulate in int64 unless dtype is given."""
        return _C.ops.cumsum(self._tensor(x, "cumsum"), int(dim), dtype)

    def bincount(self, indices, minlength):
        """torch.bincount(indices, minlength=minlength) with exactly minlength bins (int64), e.g.
        tokens per expert; every value must lie in [0, minlength) (checked when it runs)."""
        if not isinstance(minlength, numbers.Integral) or isinstance(minlength, bool):
            raise _C.ArgumentError(f"bincount: minlength must be a Python int; got {type(minlength).__name__}")
        return _C.ops.bincount(self._tensor(indices, "bincount"), int(minlength))
