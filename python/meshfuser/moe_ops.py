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

    def index_add(self, x, *args):
        """torch.index_add(x, dim, index, src): a copy of x with the slices of src along dim added
        at the positions the 1-D index names (repeats accumulate): the weighted combine of a
        mixture-of-experts layer. nvFuser's order (x, index, src, dim) works too."""
        dim, (index, src) = _dim_and_tensors("index_add", args)
        return _C.ops.index_add(self._tensor(x, "index_add"), dim, index, src)

    def cumsum(self, x, dim, dtype=None):
        """torch.cumsum; integer and bool inputs accumulate in int64 unless dtype is given."""
        return _C.ops.cumsum(self._tensor(x, "cumsum"), int(dim), dtype)

    def bincount(self, indices, minlength):
        """torch.bincount(indices, minlength=minlength) with exactly minlength bins (int64), e.g.
        tokens per expert; every value must lie in [0, minlength) (checked when it runs)."""
        if not isinstance(minlength, numbers.Integral) or isinstance(minlength, bool):
            raise _C.ArgumentError(f"bincount: minlength must be a Python int; got {type(minlength).__name__}")
        return _C.ops.bincount(self._tensor(indices, "bincount"), int(minlength))
