"""meshfuser.dtensor.compile with expert parallelism: the MoE layer of examples/moe_layer.py called
with DTensors, tokens split over the ranks and expert weights split on their expert axis
(Shard(0) on the "ep" mesh dim), against PyTorch autograd on the full tensors."""
import os
import sys

import pytest
import torch

import meshfuser

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
import moe_layer as moe  # noqa: E402

REPLICATED = ("router", "s_gate", "s_up", "s_down")


def _dtensors(params, mesh, names):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    return [distribute_tensor(params[n], mesh, [Replicate() if n in REPLICATED else Shard(0)]) for n in names]


def test_moe_layer_with_expert_sharded_dtensors(multidevice_test, setup_default_process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard

    d = multidevice_test.size
    mesh = init_device_mesh("cpu" if multidevice_test.device.type == "cpu" else "cuda", (d,), mesh_dim_names=("ep",))
    cfg = moe.MoeConfig(tokens=8, hidden=16, ffn=8, experts=2 * d, topk=2, shared_ffn=8)
    params = moe.make_params(cfg, d, multidevice_test.device, seed=5)
    grad_y = torch.randn(d * cfg.tokens, cfg.hidden).to(multidevice_test.device)
    ref = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    y_ref = moe.torch_moe(ref, cfg.topk)
    y_ref.backward(grad_y)

    layer = meshfuser.dtensor.compile(lambda fd: moe.define_moe(fd, cfg, schedule=False), expert_parallel="ep")
    y = layer(*_dtensors(params, mesh, moe.PARAMS))
    assert isinstance(y, DTensor) and list(y.placements) == [Shard(0)]
    torch.testing.assert_close(y.full_tensor(), y_ref.detach(), rtol=1e-4, atol=1e-4)

    # The training definition: every gradient; the replicated parameters' ones are this rank's share.
    partial = [1 + moe.PARAMS.index(n) for n in REPLICATED]
    step = meshfuser.dtensor.compile(lambda fd: moe.define_moe(fd, cfg, training=True, schedule=False),
                                     expert_parallel="ep", partial_outputs=partial)
    from torch.distributed.tensor import Shard as S, distribute_tensor
    outs = step(*_dtensors(params, mesh, moe.PARAMS), distribute_tensor(grad_y, mesh, [S(0)]))
    torch.testing.assert_close(outs[0].full_tensor(), y_ref.detach(), rtol=1e-4, atol=1e-4)
    for index, (name, got) in enumerate(zip(moe.PARAMS, outs[1:]), start=1):
        assert list(got.placements) == [Partial() if index in partial else Shard(0)], name
        torch.testing.assert_close(got.full_tensor(), ref[name].grad, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"gradient of {name}: {m}")


def test_expert_parallel_names_an_unknown_mesh_dim(multidevice_test, setup_default_process_group):
    from torch.distributed.device_mesh import init_device_mesh

    d = multidevice_test.size
    mesh = init_device_mesh("cpu" if multidevice_test.device.type == "cpu" else "cuda", (d,), mesh_dim_names=("dp",))
    cfg = moe.MoeConfig(tokens=4, hidden=8, ffn=4, experts=2 * d, topk=1, shared_ffn=4)
    params = moe.make_params(cfg, d, multidevice_test.device)
    layer = meshfuser.dtensor.compile(lambda fd: moe.define_moe(fd, cfg, schedule=False), expert_parallel="ep")
    with pytest.raises(meshfuser.Error, match=r"expert_parallel='ep' is not a mesh dim name of the inputs' mesh"):
        layer(*_dtensors(params, mesh, moe.PARAMS))
