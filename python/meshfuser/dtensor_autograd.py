"""torch.autograd through a compiled forward and a user-supplied backward definition, on DTensors.

`meshfuser.dtensor.compile(define, backward=define_backward, num_outputs=1)`:
* `define(fd)`'s outputs are the results (the first `num_outputs`) followed by the activations the
  backward needs (saved, never returned);
* `define_backward(fd)`'s inputs are one gradient per result, the saved activations, then the
  forward's inputs, in order; its outputs are one gradient per forward input, in order.

Calling the result runs the forward under a torch.autograd.Function: the results are DTensors that
autograd can differentiate; backward runs the compiled backward definition on the gradients, the
saved DTensors and the inputs, and redistributes each input gradient to that input's placements (so
`.grad` is sharded like the parameter; a Partial input's gradient is Replicate). Results the loss
does not use get zero gradients sharded like them. Scalars among the inputs get no gradient.
"""
from . import _C

__all__ = ["TrainableFunction"]


class TrainableFunction:
    """A forward and a backward CompiledFunction joined for torch.autograd."""

    def __init__(self, forward, backward, num_outputs):
        if not isinstance(num_outputs, int) or num_outputs < 1:
            raise _C.ArgumentError(f"num_outputs must be a positive int; got {num_outputs!r}")
        self.forward = forward
        self.backward = backward
        self.num_outputs = num_outputs
        self.__doc__ = forward.__doc__
        self.__name__ = forward.__name__

    def __call__(self, *inputs):
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
            inputs = tuple(inputs[0])
        results = _function().apply(self, *inputs)
        return results[0] if self.num_outputs == 1 else results


def _as_tuple(outputs):
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)


def _function():
    """The torch.autograd.Function, built on first use (torch stays an optional import)."""
    global _Function
    if _Function is None:
        import torch

        class MeshfuserFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, trainable, *inputs):
                outputs = _as_tuple(trainable.forward(*inputs))
                n = trainable.num_outputs
                if len(outputs) < n:
                    raise _C.ArgumentError(
                        f"{trainable.__name__}: the forward definition has {len(outputs)} outputs; "
                        f"num_outputs={n} results were expected (then the saved activations)")
                ctx.trainable = trainable
                ctx.num_saved = len(outputs) - n
                tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
                ctx.tensor_input = [isinstance(t, torch.Tensor) for t in inputs]
                ctx.scalars = [t for t in inputs if not isinstance(t, torch.Tensor)]
                # The saved activations are the backward's alone (never returned): held on ctx, not
                # through save_for_backward, so the backward can hand them over to its program,
                # which frees each after its last use (as a compiled backward frees what it read).
                ctx.activations = list(outputs[n:])
                ctx.save_for_backward(*tensors)
                # A result the loss does not use gets a zero gradient made here, sharded like the
                # result (autograd's own would be a plain tensor of the global shape on every rank).
                ctx.set_materialize_grads(False)
                ctx.result_like = [_zeros_recipe(r) for r in outputs[:n]]
                return outputs[:n]

            @staticmethod
            def backward(ctx, *grads):
                trainable = ctx.trainable
                tensors = list(ctx.saved_tensors)
                if ctx.activations is None:
                    raise RuntimeError(
                        f"{trainable.__name__}: backward through the graph a second time, after its saved "
                        "activations were freed; pass retain_graph=True to the first backward")
                # retain_graph=True keeps them for another backward; otherwise they are handed over.
                keep = _keeps_graph()
                activations = ctx.activations
                if not keep:
                    ctx.activations = None
                scalars = list(ctx.scalars)
                inputs = [tensors.pop(0) if is_tensor else scalars.pop(0) for is_tensor in ctx.tensor_input]
                grads = [g if g is not None else zeros() for g, zeros in zip(grads, ctx.result_like)]
                args = [*grads, *activations, *inputs]
                del activations
                input_grads = list(_as_tuple(trainable.backward.run(args, release_inputs=not keep)))
                if len(input_grads) != len(inputs):
                    raise _C.ArgumentError(
                        f"{trainable.__name__}: the backward definition has {len(input_grads)} outputs; "
                        f"expected one gradient per forward input ({len(inputs)})")
                return (None, *(_like(g, t) if isinstance(t, torch.Tensor) else None
                                for g, t in zip(input_grads, inputs)))

        _Function = MeshfuserFunction
    return _Function


_Function = None


def _keeps_graph():
    """Whether the running backward was asked to keep the graph (retain_graph=True). Without the
    query (older PyTorch) the graph is taken as kept: the activations are then not handed over."""
    import torch
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


def _zeros_recipe(result):
    """A function making a zero gradient for `result`: a DTensor with its mesh, placements and
    local shape, or a plain zero tensor."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(result, DTensor):
        local = result.to_local()
        mesh, placements = result.device_mesh, result.placements
        shape, stride = tuple(result.shape), tuple(result.stride())
        return lambda: DTensor.from_local(torch.zeros_like(local), mesh, placements, shape=shape, stride=stride)
    return lambda: torch.zeros_like(result)


def _like(grad, inp):
    """The gradient with the input's placements (and global shape checked). A Partial input's
    gradient is Replicate, as PyTorch's redistribute gives (a gradient cannot be made Partial)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if tuple(grad.shape) != tuple(inp.shape):
        raise _C.ArgumentError(
            f"the backward definition's gradient has global shape {tuple(grad.shape)}; the input's is "
            f"{tuple(inp.shape)}")
    if isinstance(grad, DTensor) and isinstance(inp, DTensor):
        target = tuple(Replicate() if isinstance(p, Partial) else p for p in inp.placements)
        if tuple(grad.placements) != target:
            grad = grad.redistribute(inp.device_mesh, target)
    return grad
