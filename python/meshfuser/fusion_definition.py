"""FusionDefinition: the Python frontend (direct style and class style). Thin sugar over _C."""
import numbers
import threading

from torch import Tensor as _Tensor

from . import _C
from .distributed import _ensure_initialized
from .dtensor_placements import execute_with_dtensors
from ._C import DataType, ParallelType, OpType
from .moe_ops import MoeOps
from .mesh import as_device_mesh
from . import custom_op as _custom_op

try:
    from torch.compiler import is_compiling as _torch_compiling
except ImportError:  # older PyTorch
    def _torch_compiling():
        return False

TensorView = _C.TensorView
# nvFuser's "no dtype given" (Thunder writes sum(..., dtype=DataType.Null)): the op's default.
DataType.Null = None

# Plain unary and binary ops come from the op registry (one entry per op in C++); ops with
# attributes (cast, reductions, layout ops) have Python signatures of their own below.
_UNARY = [name for name, kind, has_attrs in _C.ops.table() if kind == "unary" and not has_attrs]
_BINARY = [name for name, kind, has_attrs in _C.ops.table() if kind == "binary" and not has_attrs]


class _IterDomainRef:
    """tv.axis(i): one loop axis, with .parallelize(pt), .extent, .parallel_type."""

    def __init__(self, tv, index):
        self._tv, self._index = tv, index

    def parallelize(self, pt):
        self._tv.parallelize(self._index, pt)

    @property
    def extent(self):
        return self._tv.axis_info(self._index)[0]

    @property
    def parallel_type(self):
        return self._tv.axis_info(self._index)[1]

    @property
    def is_reduction(self):
        return self._tv.axis_info(self._index)[2]

    def __repr__(self):
        return self._tv.axis_info(self._index)[3]


def _set_allocation_domain(self, axes, contiguity=True):
    """nvFuser's set_allocation_domain: the memory order of the loop axes (loop positions or tv.axis(i),
    outermost first) and their contiguity (one bool, or one per axis). Outputs come back in this order;
    an order the runtime cannot lay out (a split axis's pieces apart) is an error."""
    positions = [a._index if isinstance(a, _IterDomainRef) else int(a) for a in axes]
    flags = [bool(contiguity)] if isinstance(contiguity, (bool, int)) else [bool(c) for c in contiguity]
    self._set_allocation_domain(positions, flags)


TensorView.set_allocation_domain = _set_allocation_domain
TensorView.axis = lambda self, i: _IterDomainRef(self, i)
TensorView.axis.__doc__ = "Loop axis i (negative from the end): .parallelize(pt), .extent, .parallel_type."
_set_device_mesh = TensorView.set_device_mesh


def _set_device_mesh_any(self, mesh):
    """Places this tensor on `mesh`: a meshfuser.DeviceMesh, a torch.distributed.DeviceMesh (its
    ranks, in its shape) or a list of ranks."""
    _set_device_mesh(self, as_device_mesh(mesh))


TensorView.set_device_mesh = _set_device_mesh_any
# nvFuser's spelling, used by its tests: fd.fusion.inputs(), fd.fusion.outputs()
_C.Fusion.inputs = lambda self: [self.input(i) for i in range(self.num_inputs())]
_C.Fusion.outputs = lambda self: [self.output(i) for i in range(self.num_outputs())]
TensorView.__add__ = lambda a, b: _current_ops(a).add(a, b)
TensorView.__radd__ = lambda a, b: _current_ops(a).add(b, a)
TensorView.__sub__ = lambda a, b: _current_ops(a).sub(a, b)
TensorView.__rsub__ = lambda a, b: _current_ops(a).sub(b, a)
TensorView.__mul__ = lambda a, b: _current_ops(a).mul(a, b)
TensorView.__rmul__ = lambda a, b: _current_ops(a).mul(b, a)
TensorView.__truediv__ = lambda a, b: _current_ops(a).div(a, b)
TensorView.__neg__ = lambda a: _current_ops(a).neg(a)
TensorView.__rtruediv__ = lambda a, b: _current_ops(a).div(b, a)
TensorView.__pow__ = lambda a, b: _current_ops(a).pow(a, b)
TensorView.__rpow__ = lambda a, b: _current_ops(a).pow(b, a)
TensorView.__abs__ = lambda a: _current_ops(a).abs(a)
# Comparisons build ops (nvFuser's semantics): `a == 0` is a bool tensor, not a Python bool that
# fd.ops.where would take as a constant. A TensorView keeps identity hashing, and has no truth
# value: `if a == b:` or `tv in some_list` is an error instead of a silent answer.
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(TensorView, f"__{_name}__", lambda a, b, _op=_name: getattr(_current_ops(a), _op)(a, b))
TensorView.__hash__ = object.__hash__


def _no_truth_value(_tv):
    raise _C.Error("a TensorView has no truth value: comparisons build bool tensors (use fd.ops.where), "
                   "and membership tests compare identities (use `any(t is x for x in ...)`)")


TensorView.__bool__ = _no_truth_value

class _ActiveDefinitions(threading.local):
    """The definitions being built, innermost last: per thread, so that operator sugar in one
    thread never lands in a definition another thread is building."""

    def __init__(self):
        self.stack = []


_active_definitions = _ActiveDefinitions()


def _current_ops(_tv):
    if not _active_definitions.stack:
        raise _C.Error("tensor arithmetic needs an active FusionDefinition")
    return _active_definitions.stack[-1].ops


class _Ops(MoeOps):
    def __init__(self, fd):
        self._fd = fd
        for name in _UNARY:
            setattr(self, name, self._make_unary(getattr(OpType, name)))
        for name in _BINARY:
            setattr(self, name, self._make_binary(getattr(OpType, name)))
        for name, kind, _has_attrs in _C.ops.table():
            if kind != "exchange" and not hasattr(self, name):  # an op its registry entry defines alone: fd.ops.triu(x, diagonal=1)
                setattr(self, name, self._make_generic(name))

    def _val(self, x):
        if isinstance(x, _C.Val):
            return x
        if isinstance(x, bool):
            return self._fd.define_scalar(x, DataType.Bool)
        if isinstance(x, numbers.Integral):
            return self._fd.define_scalar(int(x), DataType.Int)
        if isinstance(x, numbers.Real):
            return self._fd.define_scalar(float(x), DataType.Double)
        raise _C.ArgumentError(f"expected a TensorView, a scalar or a Python number; got {type(x).__name__}")

    def _make_unary(self, op):
        def unary(x):
            x = self._val(x)
            if not isinstance(x, TensorView):
                return _C.ops.scalar_op(op, [x])  # a scalar, usable as an operand
            return _C.ops.unary(op, x)
        unary.__name__ = unary.__qualname__ = op.name
        unary.__doc__ = f"fd.ops.{op.name}(x): elementwise {op.name} of a TensorView, or of a scalar (a scalar)."
        return unary

    def _make_binary(self, op):
        def binary(a, b):
            a, b = self._val(a), self._val(b)
            if not isinstance(a, TensorView) and not isinstance(b, TensorView):
                # A scalar; integer add/sub/mul of sizes stay usable as shapes and bounds.
                return _C.ops.scalar_op(op, [a, b])
            return _C.ops.binary(op, a, b)
        binary.__name__ = binary.__qualname__ = op.name
        binary.__doc__ = (f"fd.ops.{op.name}(a, b): elementwise {op.name} of TensorViews, scalars or Python numbers "
                          "(broadcast as in PyTorch).")
        return binary

    def _make_generic(self, name):
        def generic(*operands, **attrs):
            return _C.ops.build(name, [self._val(x) for x in operands], attrs)
        generic.__name__ = generic.__qualname__ = name
        generic.__doc__ = (f"fd.ops.{name}(operands..., attribute=value...): the op as its registry entry declares "
                           "it (attributes by name; left out: their defaults).")
        return generic

    def _tensor(self, x, what):
        if not isinstance(x, TensorView):
            raise _C.ArgumentError(f"{what}: expected a TensorView; got {type(x).__name__}")
        return x

    def cast(self, x, dtype):
        """x converted to `dtype` (a DataType)."""
        return _C.ops.cast(self._tensor(x, "cast"), dtype)

    def where(self, cond, a, b):
        """a where cond is true, else b (tensors, scalars or Python numbers)."""
        return _C.ops.where(self._val(cond), self._val(a), self._val(b))

    def _reduce(self, op, x, dims, keepdim, dtype=None):
        x = self._tensor(x, op)
        dims = [dims] if isinstance(dims, int) else list(dims)
        out = _C.ops.reduction(op, x, dims, dtype)
        if keepdim:
            rank = len(x.shape)
            norm = sorted(d % rank for d in dims)
            kept = [i for i in range(rank) if i not in norm]
            shape = [1 if i in norm else -1 for i in range(rank)]
            out = _C.ops.broadcast_in_dim(out, shape, kept)
        return out

    def sum(self, x, dims, keepdim=False, dtype=None):
        """Sum over `dims` (an int or a list); the result axes are reduction axes unless keepdim."""
        return self._reduce(OpType.sum, x, dims, keepdim, dtype)

    def max(self, x, dims, keepdim=False):
        """Maximum over `dims`."""
        return self._reduce(OpType.max, x, dims, keepdim)

    def min(self, x, dims, keepdim=False):
        """Minimum over `dims`."""
        return self._reduce(OpType.min, x, dims, keepdim)

    def broadcast_in_dim(self, x, shape, broadcast_dims):
        """x broadcast to `shape`; broadcast_dims[i] is the output axis of x's axis i."""
        shape = list(shape)
        x = self._tensor(x, "broadcast_in_dim")
        if any(isinstance(s, _C.Val) for s in shape):  # runtime extents: fd.ops.shape/size, scalar inputs
            return _C.ops.broadcast_in_dim_vals(x, [self._val(s) for s in shape], list(broadcast_dims))
        return _C.ops.broadcast_in_dim(x, shape, list(broadcast_dims))

    def broadcast(self, x, is_broadcast_dim):
        """nvFuser's broadcast: the output has an axis of extent 1 wherever is_broadcast_dim is True
        and x's axes, in order, elsewhere."""
        x = self._tensor(x, "broadcast")
        flags = [bool(b) for b in is_broadcast_dim]
        kept = [i for i, b in enumerate(flags) if not b]
        if len(kept) != len(x.shape):
            raise _C.ArgumentError(f"broadcast: is_broadcast_dim {flags} keeps {len(kept)} axes but {x} has "
                                   f"{len(x.shape)}")
        return self.broadcast_in_dim(x, [1 if b else -1 for b in flags], kept)

    def squeeze(self, x, dims):
        """x without the extent-1 axes `dims`."""
        return _C.ops.squeeze(self._tensor(x, "squeeze"), [dims] if isinstance(dims, int) else list(dims))

    def permute(self, x, dims):
        """x with its axes in the order `dims` (as torch.permute)."""
        return _C.ops.permute(self._tensor(x, "permute"), list(dims))

    def reshape(self, x, shape=None, new_shape=None):
        """x with a new global shape (ints, -1 for one inferred axis, or runtime extents)."""
        if (shape is None) == (new_shape is None):
            raise _C.ArgumentError("reshape: give the shape once, as `shape` or as nvFuser's `new_shape`")
        x = self._tensor(x, "reshape")
        shape = list(shape if new_shape is None else new_shape)
        if all(isinstance(s, numbers.Integral) for s in shape):
            return _C.ops.reshape(x, [int(s) for s in shape])
        return _C.ops.reshape_vals(x, [self._val(s) for s in shape])

    def size(self, x, dim):
        """The runtime extent of x's axis `dim`, usable as a shape."""
        return _C.ops.size(self._tensor(x, "size"), int(dim))

    def shape(self, x):
        """The runtime extents of x, usable as a shape."""
        return _C.ops.shape(self._tensor(x, "shape"))

    def slice(self, x, start_indices, end_indices, strides=None, manual_normalization=False):
        """x[start:end:stride] on every axis; bounds may be ints or scalars (negative ones wrap)."""
        if manual_normalization:
            # nvFuser's flag: the bounds are already normalized, so they are used as given (never
            # wrapped or clamped); a static bound outside [0, extent] is an error rather than UB.
            for axis, (s, e, n) in enumerate(zip(start_indices, end_indices, self._tensor(x, "slice").shape)):
                bad = [b for b in (s, e) if isinstance(b, numbers.Integral) and (b < 0 or (n >= 0 and b > n))]
                if bad or (isinstance(s, numbers.Integral) and isinstance(e, numbers.Integral) and e < s):
                    raise _C.ArgumentError(f"slice: axis {axis} of {x!r} has bounds [{s}, {e}) with "
                                           f"manual_normalization; expected 0 <= start <= end <= {n}")
        starts = [self._val(s) for s in start_indices]
        ends = [self._val(e) for e in end_indices]
        return _C.ops.slice(self._tensor(x, "slice"), starts, ends, [int(s) for s in (strides or [])],
                            not manual_normalization)

    def pad(self, x, pad_widths, value=None):
        """x padded as torch.nn.functional.pad (widths last axis first) with `value` (0 by default)."""
        return _C.ops.pad(self._tensor(x, "pad"), [int(w) for w in pad_widths],
                          None if value is None else self._val(value))

    def cat(self, tensors, dim=0, manual_padding=False):
        """The tensors concatenated along `dim`."""
        if manual_padding:
            raise _C.ArgumentError("cat: manual_padding=True (inputs already padded to the output's extent) is not "
                                   "supported; pass the unpadded tensors")
        return _C.ops.cat([self._tensor(t, "cat") for t in tensors], int(dim))

    def stride_order(self, x, stride_order):
        """The same values as x in the memory layout `stride_order` (nvFuser's meaning)."""
        return _C.ops.stride_order(self._tensor(x, "stride_order"), [int(s) for s in stride_order])

    def var_mean(self, x, dims, correction=1, keepdim=False):
        """(variance, mean) over `dims`, as torch.var_mean."""
        dims = [dims] if isinstance(dims, int) else list(dims)
        return _C.ops.var_mean(self._tensor(x, "var_mean"), dims, float(correction), bool(keepdim))

    def matmul(self, a, b):
        """a @ b, as torch.matmul."""
        return _C.ops.matmul(self._tensor(a, "matmul"), self._tensor(b, "matmul"))

    def linear(self, x, w, bias=None):
        """x @ w.T (+ bias), as torch.nn.functional.linear; the output ends with its reduction axis."""
        return _C.ops.linear(self._tensor(x, "linear"), self._tensor(w, "linear"), bias)

    def sdpfa_fwd(self, q, k, v, dropout_p=None, is_causal=None, scale=None):
        """attn, logsumexp, seed, offset; options are numbers, constant scalars or None."""
        q, k, v = (self._tensor(t, "sdpfa_fwd") for t in (q, k, v))
        return _C.ops.sdpfa_fwd(q, k, v, dropout_p, is_causal, scale)

    def sdpfa_bwd(self, grad_attn, q, k, v, attn, logsumexp, dropout_p, is_causal, seed, offset, scale=None):
        """grad_q, grad_k, grad_v; give the forward's options again."""
        tensors = [self._tensor(t, "sdpfa_bwd") for t in (grad_attn, q, k, v, attn, logsumexp, seed, offset)]
        return _C.ops.sdpfa_bwd(*tensors[:6], dropout_p, is_causal, *tensors[6:], scale)

    def uniform(self, low, high, shape, dtype=DataType.Float, rng_seed=None, rng_offset=None):
        """Values in [low, high), a function of (rng_seed, rng_offset, global element index) only:
        any sharding of the output draws what the unsharded program draws. rng_seed and rng_offset
        are integers in [0, 2^53) (Python ints or integer fd scalars); None means 0, so a definition
        without them draws the same values on every call: pass a new offset (or seed) per call for
        fresh numbers, e.g. a runtime `fd.define_scalar(dtype=DataType.Int)`."""
        if any(isinstance(s, _C.Val) for s in shape):
            raise _C.ArgumentError("uniform: shape must be static ints in this version (symbolic extents are not "
                                   "supported yet); got " + repr(list(shape)))
        shape = [int(s) for s in shape]
        seed = self._val(0 if rng_seed is None else rng_seed)
        offset = self._val(0 if rng_offset is None else rng_offset)
        return _C.ops.uniform(self._val(low), self._val(high), shape, dtype, seed, offset)

    def embedding_fwd(self, indices, weight, padding_idx=None, max_norm=None, norm_type=None,
                      scale_grad_by_freq=None, sparse=None):
        """torch.nn.functional.embedding's forward: output [*indices.shape, embedding_dim]."""
        for name, value in (("max_norm", max_norm), ("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
            if value not in (None, False):
                raise _C.ArgumentError(f"embedding_fwd: {name}={value!r} is not supported (only None or False)")
        if norm_type not in (None, 2.0, 2):
            raise _C.ArgumentError(f"embedding_fwd: norm_type={norm_type!r} only matters with max_norm, which is "
                                   "not supported")
        return _C.ops.embedding_fwd(self._tensor(indices, "embedding_fwd"), self._tensor(weight, "embedding_fwd"),
                                    None if padding_idx is None else int(padding_idx))


class _Sched:
    """self.sched in the class style: schedule calls that take the tensor first."""

    def _set_device_mesh(self, tv, mesh):
        """tv.set_device_mesh(mesh)."""
        tv.set_device_mesh(mesh)

    set_device_mesh = _set_device_mesh

    def split(self, tv, axis, factor, inner_split=True):
        """tv.split(axis, factor, inner_split); inner_split=False is an outer split (`factor` parts)."""
        tv.split(axis, factor, inner_split)

    def merge(self, tv, axis):
        tv.merge(axis)

    def reorder(self, tv, old_to_new):
        tv.reorder(old_to_new)

    def parallelize(self, tv, axis, pt):
        """tv.axis(axis).parallelize(pt)."""
        tv.parallelize(axis, pt)

    def set_allocation_as_loop(self, tv):
        tv.set_allocation_as_loop()

    def swizzle1d(self, tv, axis, pt):
        tv.swizzle1d(axis, pt)

    def rfactor(self, tv, axes):
        return tv.rfactor(list(axes))


class Sharding:
    """How one output is sharded: its mesh and, per mesh axis, the tensor axis it splits."""

    def __init__(self, mesh, axes):
        self.mesh = mesh
        self._axes = axes

    def axis_sharded_on(self, pt):
        return self._axes.get(pt, -1)

    def __repr__(self):
        return f"Sharding(mesh={self.mesh}, axes={ {str(k): v for k, v in self._axes.items() if v >= 0} })"


class FusionDefinition:
    """Direct style: `with FusionDefinition() as fd: ...; fd.execute(inputs)`.
    Class style: subclass, define `definition()` (and optionally `multidevice_schedule()`), then
    `outputs, shardings = Model().execute(inputs)`."""

    def __init__(self, overlap=None):
        self._fusion = _C.Fusion()
        self._handle = _C.FusionHandle(self._fusion)
        self.ops = _Ops(self)
        self.sched = _Sched()
        self._defined = False
        self.overlap = overlap
        self._key = _custom_op.register(self)

    @property
    def overlap(self):
        """Overlap applied to the program's linears without a stream schedule: None, "auto",
        "ring" or "chunked" (see README "Overlap"). Part of the program: it keys the caches."""
        return self._fusion.overlap() or None

    @overlap.setter
    def overlap(self, mode):
        if mode is not None and not isinstance(mode, str):
            raise _C.ArgumentError(f'overlap: expected None, "auto", "ring" or "chunked"; got {mode!r}')
        self._fusion.set_overlap(mode or "")

    # -- definition ---------------------------------------------------------------------------
    def __enter__(self):
        _active_definitions.stack.append(self)
        return self

    def __exit__(self, *exc):
        _active_definitions.stack.pop()
        self._defined = True
        return False

    def define_tensor(self, shape, dtype=None, contiguity=None, stride_order=None, symbolic_sizes=None,
                      is_cpu=False, name=None):
        """An input tensor of global `shape` (-1: an extent known at run time) and `dtype`
        (default: float; under meshfuser.dtensor.compile, the dtype of the matching input).

        contiguity: a bool for every axis, or one per axis (nvFuser's meaning); stride_order: the
        memory order of the axes (nvFuser's); symbolic_sizes: nvFuser's spelling of `shape`;
        name: shown by print(fd), fd.host_program() and error messages ("T0 (hidden_states)").
        """
        if is_cpu:  # nvFuser's CPU scalar tensors beside a GPU fusion; here a fusion runs where its inputs are
            raise _C.ArgumentError("define_tensor: is_cpu=True is not supported; pass a 0-D value with "
                                   "define_scalar, or run the whole fusion on CPU tensors")
        if symbolic_sizes is not None:
            shape = symbolic_sizes
        if dtype is None:
            given = getattr(self, "_input_dtypes", None)  # set by meshfuser.dtensor.compile
            index = self._fusion.num_inputs()
            dtype = given[index] if given is not None and index < len(given) and given[index] is not None \
                else DataType.Float
        if isinstance(contiguity, bool):
            contiguity = [contiguity] * len(shape)
        tv = self._fusion.define_tensor([int(s) for s in shape], dtype, list(contiguity or []), list(stride_order or []))
        if name is not None:
            tv._set_name(str(name))
        return tv

    def define_scalar(self, value=None, dtype=None):
        """A constant (value given) or a runtime scalar input (value None, passed to execute)."""
        if dtype is None:
            dtype = DataType.Bool if isinstance(value, bool) else (
                DataType.Int if isinstance(value, numbers.Integral) else DataType.Double)
        # Constants are held as doubles: an integer past 2^53 would silently become another one.
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) > 2 ** 53:
            raise _C.Error(f"define_scalar: the integer constant {int(value)} is past 2^53; meshfuser holds "
                           f"constants as doubles, which would round it to {int(float(value))}. Pass it as a "
                           "tensor or a runtime scalar input instead")
        return self._fusion.define_scalar(dtype, None if value is None else float(value))

    def add_output(self, tv):
        """Makes `tv` an output of the program (execute returns outputs in this order)."""
        self._fusion.add_output(tv)

    def _ensure_defined(self):
        if self._defined:
            return
        if type(self).definition is not FusionDefinition.definition:
            _active_definitions.stack.append(self)
            try:
                self.definition()
                self.multidevice_schedule()
            finally:
                _active_definitions.stack.pop()
        self._defined = True

    def definition(self):  # class style overrides
        pass

    def multidevice_schedule(self):  # class style overrides
        pass

    # -- running ------------------------------------------------------------------------------
    def execute(self, inputs, release_inputs=False):
        """Runs the program on this rank's local shards (or DTensors) and returns its outputs.

        inputs: one torch.Tensor (this rank's local shard) or Python number per fusion input, in
        definition order. Every rank of the job must call execute on the same definition.
        release_inputs=True hands the inputs over: `inputs` must be a list, execute empties it, and
        the program drops each tensor after its last use, so a tensor nobody else references (a
        backward's saved activations) is freed during the call rather than after it, as a compiled
        backward frees what it has read. Tensors the caller still references are not affected.
        Returns: the direct style (`with FusionDefinition() as fd`) a list of local output
        tensors; the class style (a subclass with definition()) a pair (outputs, shardings), one
        Sharding per output (fd.get_output_shardings()). Inside torch.compile it is one custom op
        (meshfuser::run_fusion), and the class style's shardings are None.
        """
        if release_inputs and type(inputs) is not list:
            raise _C.ArgumentError(f"execute(release_inputs=True) empties the list of inputs it is given; got a "
                                f"{type(inputs).__name__}: pass a list")
        if _torch_compiling():
            if release_inputs:
                raise _C.ArgumentError("execute(release_inputs=True) inside torch.compile: the compiled graph frees "
                                        "its own buffers; leave release_inputs out there")
            outputs = _custom_op.run_fusion(self._key, list(inputs))
            return (outputs, None) if type(self).definition is not FusionDefinition.definition else outputs
        return self._execute_eager(inputs, release_inputs)

    def _execute_eager(self, inputs, release_inputs=False):
        # Runs once per layer per step: kept to a few attribute lookups (host time per call is
        # time the GPU may wait for).
        if not self._defined:
            self._ensure_defined()
        _ensure_initialized()
        handle = self._handle
        entered = handle.entered
        try:
            if type(inputs) is not list:
                inputs = list(inputs)
            # (No loop variable left behind: it would keep an input that release_inputs hands over.)
            if any(type(t) is not _Tensor and type(t).__name__ == "DTensor" for t in inputs):
                outputs, shardings = execute_with_dtensors(self, inputs, release_inputs)
                return (outputs, shardings) if type(self).definition is not FusionDefinition.definition \
                    else outputs
        except Exception as e:
            # Failed before reaching the program: the other ranks are told through this call's
            # agreement (README "Reliability"), instead of waiting for this rank until the timeout.
            if handle.entered == entered:
                handle.refuse(f"{type(e).__name__}: {e}")
            raise
        outputs = handle.execute(inputs, release_inputs)
        if type(self).definition is not FusionDefinition.definition:
            return outputs, self.get_output_shardings()
        return outputs

    def cuda_kernels(self, inputs, arch=None, device_limits=None):
        """CUDA C++ source of each kernel the GPU path generates for inputs of these shapes and
        dtypes. Works without a GPU: inputs may be CPU or meta tensors. The kernels are generated
        for the current CUDA device, or without one for sm_90 (H100/H200); arch="sm_80" takes that
        architecture's limits (meshfuser.known_architectures()), device_limits a
        meshfuser.DeviceLimits or a dict of fields overriding the arch's (e.g. {"sm_count": 54})."""
        self._ensure_defined()
        from .distributed import _ensure_initialized
        _ensure_initialized()
        return self._handle.cuda_kernels(list(inputs), arch, device_limits)

    def get_output_shardings(self):
        """One Sharding per output of the last execute: .mesh and .axis_sharded_on(parallel_type)."""
        return [Sharding(mesh, axes) for mesh, axes in self._handle.output_shardings()]

    def host_program(self, deallocations=False):
        """This rank's lowered program of the last execute(): segments (with what ran them),
        communications (team, layout, bytes sent and received), waits, stream loops and outputs.
        deallocations=True also lists where each intermediate is freed."""
        return self._handle.host_program(deallocations)

    def compiled_fusion(self):
        """The IR of the last execute's program after the passes (text)."""
        return self._handle.compiled_fusion()

    def fusion_after_passes(self):
        """[(pass name, IR after it)] for this definition, without running anything."""
        self._ensure_defined()
        return self._fusion.print_after_passes()

    @property
    def fusion(self):
        self._ensure_defined()
        return self._fusion

    def __str__(self):
        self._ensure_defined()
        return str(self._fusion)

    def __repr__(self):
        return str(self)


def shard_tensor(t, tv, rank=None):
    """This rank's shard of global tensor `t`, following tv's mesh and device splits."""
    from .distributed import Communicator
    if rank is None:
        rank = Communicator.instance().rank()
    if not tv.has_device_mesh():
        return t
    import torch
    for axis in range(t.dim()):
        # Global positions this rank holds along the axis (any nesting of splits, inner ones too).
        positions = tv.shard_positions(axis, t.size(axis), rank)
        if positions is not None:
            t = t.index_select(axis, torch.tensor(positions, dtype=torch.long, device=t.device))
    return t.contiguous()

