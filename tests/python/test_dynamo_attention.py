"""The CUDA flash-attention rewrite (meshfuser::attention), checked on CPU: a graph holding
PyTorch's CUDA flash-attention forward and backward ops (as AOTAutograd traces them on a GPU) is
rewritten, partitioned and run by meshfuser, whose sdpfa runs the CPU kernel here."""
import operator

import torch
import torch.fx as fx

import meshfuser.dynamo
from meshfuser.dynamo.attention import ATTENTION, ATTENTION_BACKWARD, prepare_attention
from meshfuser.dynamo.partition import partition

aten = torch.ops.aten


def _graph(b, h, kv, s, d):
    """forward: (out, lse, rng_state) of flash attention; backward graph of it: (gq, gk, gv)."""
    q, k, v = torch.empty(b, h, s, d), torch.empty(b, kv, s, d), torch.empty(b, kv, s, d)
    lse, rng = torch.empty(b, h, s), torch.empty(2, dtype=torch.int64)
    empty = torch.empty(0, dtype=torch.int64)

    fw = fx.Graph()
    nodes = [fw.placeholder(n) for n in "qkv"]
    for n, val in zip(nodes, (q, k, v)):
        n.meta["val"] = val
    flash = fw.call_function(aten._scaled_dot_product_flash_attention.default, tuple(nodes) + (0.0, True),
                             {"scale": 0.25})
    flash.meta["val"] = (q, lse, empty, empty, s, s, rng, rng, empty)
    outs = []
    for i in (0, 1, 6):
        outs.append(fw.call_function(operator.getitem, (flash, i)))
        outs[-1].meta["val"] = flash.meta["val"][i]
    fw.output(tuple(outs))

    bw = fx.Graph()
    names = ["grad", "q", "k", "v", "out", "lse", "rng"]
    ph = {n: bw.placeholder(n) for n in names}
    for n, val in zip(names, (q, q, k, v, q, lse, rng)):
        ph[n].meta["val"] = val
    back = bw.call_function(aten._scaled_dot_product_flash_attention_backward.default, (
        ph["grad"], ph["q"], ph["k"], ph["v"], ph["out"], ph["lse"], ph["rng"], ph["rng"], s, s, 0.0, True,
        ph["rng"], ph["rng"]), {"scale": 0.25})
    back.meta["val"] = (q, k, v)
    grads = []
    for i in range(3):
        grads.append(bw.call_function(operator.getitem, (back, i)))
        grads[-1].meta["val"] = back.meta["val"][i]
    bw.output(tuple(grads))
    return fx.GraphModule(torch.nn.Module(), fw), fx.GraphModule(torch.nn.Module(), bw)


def test_cuda_flash_pair_runs_as_meshfuser_attention():
    meshfuser.dynamo.clear_reports()
    b, h, kv, s, d = 2, 4, 2, 8, 16
    fw, bw = _graph(b, h, kv, s, d)
    fw, bw = prepare_attention(fw), prepare_attention(bw)
    assert ATTENTION in [n.target for n in fw.graph.nodes]
    assert ATTENTION_BACKWARD in [n.target for n in bw.graph.nodes]
    fw, fw_report = partition(fw, "forward")
    bw, bw_report = partition(bw, "backward")
    assert [op for _n, op, _r in fw_report.eager] == ["empty.memory_format"]  # the unused RNG state
    assert not bw_report.eager

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, s, d, generator=g, requires_grad=True) for n in (h, kv, kv))
    out, lse, _rng = fw(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(b, h, s, d, generator=g)
    gq, gk, gv = bw(grad, q, k, v, out, lse, torch.zeros(2, dtype=torch.int64))
    expected.backward(grad)
    for actual, want in zip((gq, gk, gv), (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(actual, want, atol=1e-5, rtol=1e-5)
