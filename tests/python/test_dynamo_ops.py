"""Each ATen op the backend translates, alone or in a small function, against eager PyTorch: same
values, same dtype, and nothing left on ATen."""
import pytest
import torch

import meshfuser.dynamo

F = torch.nn.functional

CASES = {
    "unary": lambda x: [f(x) for f in (torch.neg, torch.abs, torch.exp, torch.tanh, torch.relu, torch.sigmoid,
                                       torch.sin, torch.cos, torch.erf, F.silu, F.gelu)],
    "positive": lambda x: [torch.log(x.abs() + 1), torch.sqrt(x.abs()), torch.rsqrt(x.abs() + 1),
                           torch.reciprocal(x.abs() + 1)],
    "binary": lambda x: [x + 2 * x, x - 1.5, 3 - x, x * x, x / (x.abs() + 1), torch.maximum(x, -x),
                         torch.minimum(x, 0.5 * x), torch.add(x, x, alpha=2)],
    "pow": lambda x: [x ** 2, x ** 3, x.abs() ** 0.5, (x.abs() + 1) ** -1, (x.abs() + 1) ** -0.5],
    "compare": lambda x: [x > 0, x <= 0.5, x == x, torch.where(x > 0, x, -2 * x), x.masked_fill(x < 0, 0.25),
                          torch.clamp(x, -0.5, 0.5), x.clamp_min(0.1)],
    "cast": lambda x: [x.to(torch.bfloat16), x.half().float(), (x > 0).float(), x.double() * 2],
    "views": lambda x: [x.view(4, 2, 3).transpose(0, 2).reshape(6, 4), x.t().unsqueeze(1).expand(6, 3, 4),
                        x[1:3, ::2], x.select(1, 2), x.narrow(1, 1, 3), torch.split(x, [1, 3], 0)[1] * 1,
                        x.unsqueeze(0).squeeze(0) + 0, x.permute(1, 0).contiguous()],
    "resize": lambda x: [torch.cat([x, 2 * x], 1), F.pad(x, (1, 2, 0, 1)), torch.stack([x, x], 0)],
    "reductions": lambda x: [x.sum(), x.sum(1), x.sum(0, keepdim=True), x.mean(-1), x.amax(1), x.amin(0),
                             x.var(1), torch.var_mean(x, 0, correction=0)[1], x.softmax(-1), x.log_softmax(0)],
    "contractions": lambda x: [x @ x.t(), torch.bmm(x.unsqueeze(0), x.t().unsqueeze(0)),
                               torch.addmm(x[0], x.t(), x), F.linear(x, x[:3] * 2)],
    "constants": lambda x: [x * torch.ones_like(x), x + torch.zeros(6), torch.full_like(x, 3.0) - x,
                            x * torch.tensor(2.0)],
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("case", sorted(CASES))
def test_op(case):
    fn = CASES[case]
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    expected = fn(x)
    actual = torch.compile(fn, backend="meshfuser")(x)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e)
    on_aten = [(op, why) for r in meshfuser.dynamo.reports() for _n, op, why in r.eager]
    assert on_aten == []


def test_embedding_and_gradients():
    table = torch.randn(10, 4, requires_grad=True)
    ids = torch.tensor([[1, 3, 3], [0, 9, 2]])

    def f(t, i):
        return (F.embedding(i, t) * 2).tanh()

    torch.testing.assert_close(torch.compile(f, backend="meshfuser")(table, ids), f(table, ids))
    forward = meshfuser.dynamo.reports()[0]
    assert "embedding" in dict(forward.partitions[0][1])
