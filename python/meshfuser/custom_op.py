"""execute() as a torch.library custom op, so that a function compiled by torch.compile (fullgraph
too) can call a FusionDefinition: Dynamo records one `meshfuser::run_fusion` node instead of
tracing into meshfuser (which would break the graph). Its fake implementation gives the outputs'
local shapes, dtypes and strides by walking the program on meta tensors (nothing runs)."""
import itertools
import weakref

import torch

_definitions = weakref.WeakValueDictionary()  # key -> FusionDefinition
_keys = itertools.count()


def register(fd):
    """A key for `fd`, constant in a compiled graph."""
    key = next(_keys)
    _definitions[key] = fd
    return key


def _definition(key):
    fd = _definitions.get(key)
    if fd is None:
        from . import _C
        raise _C.Error(f"meshfuser::run_fusion: the FusionDefinition (key {key}) this compiled graph calls no longer "
                       "exists; keep the definition alive as long as the compiled function")
    return fd


@torch.library.custom_op("meshfuser::run_fusion", mutates_args=())
def run_fusion(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    result = _definition(key)._execute_eager(inputs)
    if isinstance(result, tuple):  # the class style's (outputs, shardings)
        result = result[0]
    return [t.clone() if any(t is x for x in inputs) else t for t in result]  # a custom op never returns an input


@run_fusion.register_fake
def _run_fusion_fake(key, inputs):
    fd = _definition(key)
    fd._ensure_defined()
    device = inputs[0].device if inputs else torch.device("cpu")
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        from .distributed import _ensure_initialized
        _ensure_initialized()
        metas = [torch.empty_strided([int(s) for s in t.shape], [int(s) for s in t.stride()], dtype=t.dtype,
                                     device="meta") for t in inputs]
        outs = [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in fd._handle.meta_outputs(metas)]
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in outs]
