"""meshfuser.dtensor.compile(define, backward=define_backward) on the GPT block: DTensor weights and
activations in (Megatron TP placements), DTensors out, torch.autograd through the backward
definition; output and every parameter gradient equal unsharded PyTorch autograd on 1-4 ranks."""
import pathlib
import sys

import pytest
import torch

import meshfuser
import meshfuser.dtensor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
import transformer_blocks as blocks  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TOL = dict(rtol=1e-4, atol=1e-4)


def _torch_mesh(device, d):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device.type, (d,))


def _dtensors(full, mesh, split):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    return {n: distribute_tensor(t, mesh, [Shard(split[n]) if n in split else Replicate()]).requires_grad_()
            for n, t in full.items()}


# TP: the Megatron plan (the definitions carry no sharding; propagation finds it from the weights).
# SP from DTensors: x is Shard(1) and nothing else is annotated. The forward is Megatron's SP plan:
# each row-parallel partial is read only by a sequence-split residual add, so it is reduce-scattered
# (propagate_shardings' scatterReductionForReaders); in the backward the partials read by sequence-
# split work and by bias-gradient sums are reduce-scattered too. The backward runs 14 communications
# where the examples' own SP backward definition runs 10: two more Allgathers (the saved LayerNorm
# outputs arrive split on the sequence and are gathered again for the weight gradients, as
# Megatron's SP backward does) and two more Allreduces of [e] vectors (the row-parallel layers'
# bias gradients, summed from the sequence-split gradient rather than from its gathered copy).
PLANS = {"tp": (["Allreduce"] * 2, ["Allreduce"] * 2),  # backward: d_ln1, and q + k + v summed first
         "sp": (["Allgather", "ReduceScatter"] * 2,
                # the q, k and v input gradients summed before one ReduceScatter (sum_partials)
                ["Allgather", "ReduceScatter"] * 2 + ["Allreduce"] * 2
                + ["Allgather"] + ["Allreduce"] * 3 + ["Allgather", "Allreduce"])}


@pytest.mark.float32_attention
@pytest.mark.parametrize("form", ["tp", "sp"])
def test_gpt_block_forward_backward_from_dtensors(multidevice_test, form):
    d = multidevice_test.size
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    b, s, h, hd = 2, 2 * d, 2 * d, 4
    e = h * hd
    full = blocks.gpt_parameters(b, s, e, seed=7)
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(8))
    ref_params = {n: t.clone().requires_grad_() for n, t in full.items()}
    ref_out = blocks.gpt_reference(ref_params, h)
    ref_out.backward(dy)

    mesh = _torch_mesh(multidevice_test.device, d)
    split = blocks.GPT_SPLIT | ({"x": 1} if form == "sp" else {})
    params = _dtensors(full, mesh, split)
    block = meshfuser.dtensor.compile(lambda fd: blocks.define_gpt_forward(fd, b, s, h, hd),
                                      backward=lambda fd: blocks.define_gpt_backward(fd, b, s, h, hd))
    with meshfuser.Profiler() as prof:
        out = block(*[params[n] for n in blocks.GPT_PARAMS])
    if d > 1:
        assert blocks.communications(prof.profile) == PLANS[form][0]
    assert tuple(out.placements) == ((Shard(1),) if form == "sp" else (Replicate(),))
    torch.testing.assert_close(out.full_tensor().cpu(), ref_out.detach(), **TOL)
    with meshfuser.Profiler() as prof:
        out.backward(distribute_tensor(dy, mesh, list(out.placements)))
    if d > 1:
        assert blocks.communications(prof.profile) == PLANS[form][1]
    for n in blocks.GPT_PARAMS:
        grad = params[n].grad
        assert grad is not None, n
        assert tuple(grad.placements) == tuple(params[n].placements), (n, grad.placements)
        torch.testing.assert_close(grad.full_tensor().cpu(), ref_params[n].grad, **TOL,
                                   msg=lambda m: f"grad of {n}: {m}")


def _scale_by_saved(fd):
    """y = x * 2, saving s = exp(x); the backward's dx = dy * s."""
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.mul(x, 2.0))
    fd.add_output(fd.ops.exp(x))


def _scale_by_saved_backward(fd):
    dy, saved, _x = (fd.define_tensor([-1, -1]) for _ in range(3))
    fd.add_output(fd.ops.mul(dy, saved))


def test_backward_hands_the_saved_activations_over(multidevice_test):
    """Without retain_graph the saved activations are the backward program's: their DTensors are gone
    before backward returns (the program frees each after its last use); with retain_graph=True they
    stay for a second backward, and a second backward without it is an error, as in PyTorch."""
    import weakref
    from torch.distributed.tensor import Shard, distribute_tensor
    d = multidevice_test.size
    mesh = _torch_mesh(multidevice_test.device, d)
    full = torch.randn(4, 2 * d, generator=torch.Generator().manual_seed(3))
    x = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
    f = meshfuser.dtensor.compile(_scale_by_saved, backward=_scale_by_saved_backward)

    freed, returned = [], [False]
    out = f(x)
    watch = [weakref.ref(a, lambda _: freed.append(returned[0])) for a in out.grad_fn.activations]
    out.backward(torch.ones_like(out))
    returned[0] = True
    assert freed == [False], (freed, watch)
    torch.testing.assert_close(x.grad.full_tensor().cpu(), torch.exp(full), **TOL)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward(torch.ones_like(out))

    x.grad = None
    out = f(x)
    out.backward(torch.ones_like(out), retain_graph=True)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad.full_tensor().cpu(), 2 * torch.exp(full), **TOL)


def test_compile_backward_rejects_bad_num_outputs(multidevice_test):
    with pytest.raises(meshfuser.Error, match="num_outputs must be a positive int"):
        meshfuser.dtensor.compile(lambda fd: None, backward=lambda fd: None, num_outputs=0)


def _double_saving_triple(fd):
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.mul(x, 2.0))
    fd.add_output(fd.ops.mul(x, 3.0))


def test_compile_backward_errors_name_the_definition_counts(multidevice_test):
    """A backward with a gradient too many, and a forward with fewer outputs than num_outputs."""
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = _torch_mesh(multidevice_test.device, multidevice_test.size)
    x = distribute_tensor(torch.ones(4, 2 * multidevice_test.size), mesh, [Shard(1)]).requires_grad_()

    def two_gradients(fd):
        g, saved, inp = (fd.define_tensor([-1, -1]) for _ in range(3))
        fd.add_output(fd.ops.mul(g, 2.0))
        fd.add_output(fd.ops.add(saved, inp))

    f = meshfuser.dtensor.compile(_double_saving_triple, backward=two_gradients)
    out = f(x)
    with pytest.raises(meshfuser.Error, match=r"backward definition has 2 outputs; expected one gradient per "
                                              r"forward input \(1\)"):
        out.backward(torch.ones_like(out))
    f = meshfuser.dtensor.compile(_double_saving_triple, backward=two_gradients, num_outputs=3)
    with pytest.raises(meshfuser.Error, match="the forward definition has 2 outputs; num_outputs=3"):
        f(x)


@pytest.mark.float32_attention
def test_llama_block_forward_from_dtensors(multidevice_test):
    """The Llama-style block from DTensors (TP placements): the Megatron plan, two Allreduce."""
    d = multidevice_test.size
    b, s, h, hd, ffn = 1, 4, 2 * d, 8, 8 * d
    full = blocks.llama_parameters(b, s, h * hd, hd, ffn, seed=11)
    mesh = _torch_mesh(multidevice_test.device, d)
    params = _dtensors(full, mesh, blocks.LLAMA_SPLIT)
    block = meshfuser.dtensor.compile(lambda fd: blocks.define_llama_forward(fd, b, s, h, hd, ffn))
    with meshfuser.Profiler() as prof:
        out = block(*[params[n] for n in blocks.LLAMA_PARAMS])
    if d > 1:
        assert blocks.communications(prof.profile) == ["Allreduce"] * 2
    torch.testing.assert_close(out.full_tensor().cpu(), blocks.llama_reference(full, h), **TOL)


def _mul_and_weight(fd):  # y1 = x * w, y2 = w * 2 (two results), saving w
    x, w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.mul(x, w))
    fd.add_output(fd.ops.mul(w, 2.0))
    fd.add_output(w)


def _mul_and_weight_backward(fd):  # g1, g2, saved w, x, w -> dx, dw
    g1, g2, sw = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
    x, _w = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.mul(g1, sw))
    fd.add_output(fd.ops.add(fd.ops.mul(g1, x), fd.ops.mul(g2, 2.0)))


@pytest.mark.parametrize("x_placement", ["shard", "partial"])
def test_compile_backward_with_an_unused_result_and_partial_inputs(multidevice_test, x_placement):
    # A result the loss does not use gets a zero gradient sharded like it (autograd's own, a plain
    # tensor, was refused); a Partial input's gradient is Replicate (redistributing to Partial failed).
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    d, device = multidevice_test.size, multidevice_test.device
    mesh = _torch_mesh(device, d)
    torch.manual_seed(0)
    X, W = torch.randn(4 * d, 6, device=device), torch.randn(4 * d, 6, device=device)
    f = meshfuser.dtensor.compile(_mul_and_weight, backward=_mul_and_weight_backward, num_outputs=2)
    if x_placement == "partial":
        x = DTensor.from_local(X / d, mesh, [Partial()]).requires_grad_()
    else:
        x = distribute_tensor(X, mesh, [Shard(0)]).requires_grad_()
    w = distribute_tensor(W, mesh, [Replicate()]).requires_grad_()
    y1, _y2 = f(x, w)
    (y1 * 3.0).sum().backward()
    xr, wr = X.clone().requires_grad_(), W.clone().requires_grad_()
    (xr * wr * 3.0).sum().backward()
    assert tuple(x.grad.placements) == ((Replicate(),) if x_placement == "partial" else (Shard(0),))
    torch.testing.assert_close(x.grad.full_tensor(), xr.grad, **TOL)
    torch.testing.assert_close(w.grad.full_tensor(), wr.grad, **TOL)
