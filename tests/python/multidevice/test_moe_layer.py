"""The mixture-of-experts layer of examples/moe_layer.py on 1-4 ranks: expert parallelism over every
rank, and expert x tensor parallelism on a 2-D mesh when the ranks allow. Forward and the training
definition (output and every gradient) against PyTorch autograd on the unsharded layer, with the
plan asserted: the exchanges (and, with tensor parallelism, the Allreduces of the row-parallel
parts), and the bytes the dispatch moved against the routing."""
import os
import sys

import pytest
import torch

from meshfuser import FusionDefinition
from meshfuser.testing import execute_with_plan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
import moe_layer as moe  # noqa: E402


def _reference(params, cfg, grad_y):
    ref = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    y = moe.torch_moe(ref, cfg.topk)
    y.backward(grad_y)
    return y.detach(), {k: v.grad for k, v in ref.items()}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("skewed", [False, True], ids=["random", "skewed_router"])
def test_moe_layer_forward_and_gradients(multidevice_test, tp, skewed):
    d, rank = multidevice_test.size, multidevice_test.rank
    if d % tp:
        pytest.skip(f"{tp}-way tensor parallelism needs an even number of ranks")
    cfg = moe.MoeConfig(tokens=12, hidden=16, ffn=8, experts=4 * (d // tp), topk=2, shared_ffn=8)
    mesh = moe.make_mesh(d, tp)
    ep = d // tp
    params = moe.make_params(cfg, ep, torch.device("cpu"), seed=3)
    if skewed:
        # Every odd expert, and every expert of the last group, never wins (a feature of 10 on every
        # token against a router weight of -10): uneven routing, and a rank whose experts get nothing.
        params["x"][:, 0] = 10.0
        losers = torch.zeros(cfg.experts, dtype=torch.bool)
        losers[1::2] = True
        if ep > 1:
            losers[-(cfg.experts // ep):] = True
        params["router"][losers, 0] = -10.0
    grad_y = torch.randn(ep * cfg.tokens, cfg.hidden)
    y_ref, grads_ref = _reference(params, cfg, grad_y)

    with FusionDefinition() as fwd:
        moe.define_moe(fwd, cfg, mesh)
    dev = multidevice_test.device
    (y,), comms = execute_with_plan(fwd, [t.to(dev) for t in moe.local_inputs(params, cfg, mesh, rank)])
    group = rank // tp
    torch.testing.assert_close(y.cpu(), y_ref.chunk(ep)[group], rtol=1e-4, atol=1e-4)

    kinds = [k for k, _, _ in comms]
    exchange = ["AllToAll", "AllToAllV", "AllToAllV"]
    tp_reductions = ["Allreduce", "Allreduce"] if tp > 1 else []  # routed experts' and shared expert's down
    assert sorted(kinds) == sorted(exchange + tp_reductions), kinds
    assert [k for k in kinds if k.startswith("AllToAll")] == exchange
    # The dispatch's bytes: this group's rows routed to other groups' experts.
    routed = torch.topk(torch.softmax(params["x"].chunk(ep)[group] @ params["router"].t(), -1), cfg.topk)[1]
    local = cfg.experts // ep
    mine = (routed // local) == group
    dispatch = comms[kinds.index("AllToAllV")]
    assert dispatch[1] == int((~mine).sum()) * cfg.hidden * 4

    with FusionDefinition() as train:
        moe.define_moe(train, cfg, mesh, training=True)
    outs = train.execute([t.to(dev) for t in moe.local_inputs(params, cfg, mesh, rank, grad_y)])
    torch.testing.assert_close(outs[0].cpu(), y_ref.chunk(ep)[group], rtol=1e-4, atol=1e-4)
    expected = moe.local_inputs(grads_ref, cfg, mesh, rank)
    columns = None
    if ep > 1:
        columns = [torch.distributed.new_group([g * tp + c for g in range(ep)]) for c in range(tp)]
    for name, got, want in zip(moe.PARAMS, outs[1:], expected):
        got = got.cpu()
        if name in ("router", "s_gate", "s_up", "s_down") and columns is not None:
            # this group's tokens' share: summed over the expert groups (data parallel)
            got = got.to(dev)
            torch.distributed.all_reduce(got, group=columns[rank % tp])
            got = got.cpu()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {name}: {m}")
