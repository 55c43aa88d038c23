"""Attention with a materialized mask through the backend: a causal mask computed from constants
becomes is_causal, repeated key/value heads become grouped-query attention, and meshfuser's sdpfa
runs it (forward and backward); a mask that depends on the inputs stays on ATen, and the report says
why. Values and gradients equal eager's."""
import copy

import pytest
import torch
import torch.nn.functional as F

import meshfuser.dynamo
from meshfuser.dynamo.attention_masks import mask_kind

CPU_ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    yield
    torch._dynamo.reset()


def _repeat_kv(x, n):
    """Hugging Face's repeat_kv: each key/value head n times in a row."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


def _bool_causal(q):
    s = q.shape[2]
    rows = torch.arange(s, device=q.device)
    return (rows[None, None, None, :] <= rows[None, None, :, None]).expand(q.shape[0], -1, s, s)


def _additive_causal(q):
    s = q.shape[2]
    upper = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return torch.zeros(s, s, dtype=q.dtype, device=q.device).masked_fill(upper, torch.finfo(q.dtype).min)


class Attention(torch.nn.Module):
    """Projections around attention whose mask `make_mask(q, x)` builds; heads repeated as
    transformers does when it passes a mask."""

    def __init__(self, make_mask, heads=4, kv_heads=2, dim=8):
        super().__init__()
        self.make_mask, self.heads, self.kv_heads, self.dim = make_mask, heads, kv_heads, dim
        self.q = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.kv = torch.nn.Linear(heads * dim, 2 * kv_heads * dim, bias=False)

    def forward(self, x, pad=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2 * self.kv_heads, self.dim).transpose(1, 2).chunk(2, dim=1)
        n = self.heads // self.kv_heads
        mask = self.make_mask(q, pad)
        out = F.scaled_dot_product_attention(q, _repeat_kv(k, n), _repeat_kv(v, n), attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, -1)


def _run(module, x, *extra):
    """Forward and backward through the backend and eagerly; returns the ops meshfuser ran and
    the (op, reason) of every node on ATen."""
    reference = copy.deepcopy(module)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(module, backend="meshfuser")(xc, *extra)
    expected = reference(xe, *extra)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, atol=1e-5, rtol=1e-5)
    for p, q in zip(module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    reports = meshfuser.dynamo.reports()
    ran = [op for r in reports for _name, ops in r.partitions for op in ops]
    return ran, [(op, reason) for r in reports for _n, op, reason in r.eager]


@pytest.mark.parametrize("make_mask", [lambda q, pad: _bool_causal(q), lambda q, pad: _additive_causal(q)],
                         ids=["bool", "additive"])
def test_materialized_causal_mask_is_causal_attention(make_mask):
    torch.manual_seed(0)
    ran, on_aten = _run(Attention(make_mask), torch.randn(2, 8, 32))
    assert on_aten == []
    assert CPU_ATTENTION in ran and CPU_ATTENTION + "_backward" in ran
    # The heads are not repeated: no expand of the keys and values, no sum of their gradients.
    assert "expand" not in ran and "sum.dim_IntList" not in ran


def test_mask_letting_everything_through_is_dropped():
    torch.manual_seed(0)
    ran, on_aten = _run(Attention(lambda q, pad: torch.ones(q.shape[2], q.shape[2], dtype=torch.bool)),
                        torch.randn(2, 8, 32))
    assert on_aten == [] and CPU_ATTENTION in ran


def test_padding_mask_from_an_input_stays_on_aten():
    def padded_causal(q, pad):
        return _bool_causal(q) & pad[:, None, None, :]

    torch.manual_seed(0)
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[1, 6:] = False
    _ran, on_aten = _run(Attention(padded_causal), torch.randn(2, 8, 32), pad)
    reasons = dict(on_aten)
    assert reasons[CPU_ATTENTION] == "attention with an explicit mask (meshfuser takes is_causal only)"
    assert reasons[CPU_ATTENTION + "_backward"] == "attention with an explicit mask (meshfuser takes is_causal only)"


def test_mask_kind():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert mask_kind(causal, 4, 4) == "causal"
    assert mask_kind(causal[None, None].expand(2, 3, 4, 4), 4, 4) == "causal"
    assert mask_kind(torch.ones(4, 4, dtype=torch.bool), 4, 4) == "none"
    assert mask_kind(causal.T, 4, 4) is None                      # anti-causal
    assert mask_kind(causal, 4, 5) is None                        # another shape
    additive = torch.zeros(4, 4).masked_fill(~causal, float("-inf"))
    assert mask_kind(additive, 4, 4) == "causal"
    assert mask_kind(additive.masked_fill(~causal, -1e4), 4, 4) is None   # a finite bias changes values
    assert mask_kind(torch.ones(4, 4, dtype=torch.int64), 4, 4) is None
