"""A GEMM output added to a partial sum is accumulated by the GEMM (host/gemm_accumulate.cpp): the
backward's input-gradient partials of several projections (q, k and v; gate and up) are summed by
cuBLAS with beta = 1 into the first partial's buffer, not by a separate add kernel. Each test checks
the plan (which segments, what runs them) and the values against PyTorch on the same tensors."""
import os
import pathlib
import re
import sys

import pytest
import torch

from meshfuser import DataType, FusionDefinition, _C

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import transformer_blocks as blocks  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROWS, K1, K2, N = 6, 5, 7, 4


def _segments(fd):
    return re.findall(r"run segment \d+ \((\w+)\): (.*)", fd.host_program())


def _summed_linears(extra_reader=False, bias=False, dtype=DataType.Float, rows=ROWS):
    """linear(a, w1) + linear(b, w2) (+ a bias on the second); extra_reader: the first partial is
    also an output."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([rows, K1], dtype=dtype)
        w1 = fd.define_tensor([N, K1], dtype=dtype)
        b = fd.define_tensor([rows, K2], dtype=dtype)
        w2 = fd.define_tensor([N, K2], dtype=dtype)
        bias_tv = fd.define_tensor([N], dtype=dtype) if bias else None
        first = fd.ops.linear(a, w1)
        second = fd.ops.linear(b, w2, bias_tv) if bias else fd.ops.linear(b, w2)
        fd.add_output(fd.ops.add(first, second))
        if extra_reader:
            fd.add_output(first)
    return fd


def _linear_inputs(bias=False, dtype=torch.float32, rows=ROWS):
    g = torch.Generator().manual_seed(0)
    shapes = [(rows, K1), (N, K1), (rows, K2), (N, K2)] + ([(N,)] if bias else [])
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _reference(inputs):
    a, w1, b, w2, *bias = inputs
    return a @ w1.t() + torch.nn.functional.linear(b, w2, bias[0] if bias else None)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_sum_of_two_gemms_is_one_accumulating_gemm(device):
    fd = _summed_linears()
    inputs = [t.to(device) for t in _linear_inputs()]
    out = fd.execute(inputs)[0]
    torch.testing.assert_close(out.cpu(), _reference([t.cpu() for t in inputs]))
    segments = _segments(fd)
    # The first GEMM, then the second accumulating into its output: no add segment of its own.
    assert [s for s, _ in segments] == ["expr_eval", "gemm_accumulate"], fd.host_program()
    assert re.fullmatch(r"T\d+ = linear\(T2, T3\); T\d+ = add\(T\d+, T\d+\)", segments[1][1]), segments


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_sum_matches_pytorch(device):
    fd = _summed_linears(dtype=DataType.BFloat16)
    inputs = [t.to(device) for t in _linear_inputs(dtype=torch.bfloat16)]
    out = fd.execute(inputs)[0]
    torch.testing.assert_close(out.float().cpu(), _reference([t.float().cpu() for t in inputs]), atol=0.05, rtol=0.02)
    assert "gemm_accumulate" in fd.host_program()


@pytest.mark.parametrize("case", ["partial_also_an_output", "biased_gemm"])
def test_no_fold_where_the_buffer_or_the_gemm_is_needed_as_is(case):
    """A partial that is also an output must keep its value; a biased GEMM adds its bias in its own
    epilogue. Both keep the separate add."""
    fd = _summed_linears(extra_reader=case == "partial_also_an_output", bias=case == "biased_gemm")
    inputs = _linear_inputs(bias=case == "biased_gemm")
    outs = fd.execute(inputs)
    torch.testing.assert_close(outs[0], _reference(inputs))
    if case == "partial_also_an_output":
        torch.testing.assert_close(outs[1], inputs[0] @ inputs[1].t())
    assert "gemm_accumulate" not in fd.host_program()
    assert any(re.fullmatch(r"T\d+ = add\(T\d+, T\d+\)", exprs) for _, exprs in _segments(fd)), fd.host_program()


def _with_option_disabled(monkeypatch, run):
    monkeypatch.setenv("MESHFUSER_DISABLE", "gemm_accumulate")
    _C.reload_options()
    try:
        return run()
    finally:
        monkeypatch.delenv("MESHFUSER_DISABLE")
        _C.reload_options()


def test_disable_option_keeps_the_add_kernel(monkeypatch):
    """Read when a program is lowered (no fold) and when it runs (a program lowered before runs its
    GEMM and add one after the other)."""
    # Another row count: a definition not lowered yet (host programs are cached by definition).
    fd = _summed_linears(rows=ROWS + 3)
    inputs = _linear_inputs(rows=ROWS + 3)
    _with_option_disabled(monkeypatch, lambda: torch.testing.assert_close(fd.execute(inputs)[0], _reference(inputs)))
    assert [s for s, _ in _segments(fd)] == ["expr_eval"] * 3, fd.host_program()
    lowered = _summed_linears()
    inputs = _linear_inputs()
    lowered.execute(inputs)
    _with_option_disabled(monkeypatch, lambda: torch.testing.assert_close(lowered.execute(inputs)[0], _reference(inputs)))
    assert [s for s, _ in _segments(lowered)] == ["expr_eval"] * 2, lowered.host_program()


@pytest.mark.parametrize("device", DEVICES)
def test_llama_backward_sums_its_partials_in_the_gemms(device):
    """gate + up, and q + k + v: three accumulating GEMMs, the sums' add kernels gone, the gradients
    as PyTorch autograd's (float32)."""
    b, s, h, hd, ffn, kv = 2, 8, 4, 8, 48, 2
    e = h * hd
    full = blocks.llama_parameters(b, s, e, hd, ffn, seed=3, kv_heads=kv)
    x = full.pop("x")
    forward = blocks.llama_forward_definition(b, s, h, hd, ffn, 1, "tp", kv_heads=kv, save=True)
    on_device = {n: t.to(device) for n, t in full.items()}
    outputs = forward.execute(blocks.llama_forward_inputs(x.to(device), on_device))
    dy = torch.randn(b, s, e, generator=torch.Generator().manual_seed(4))
    backward = blocks.llama_backward_definition(b, s, h, hd, ffn, 1, "tp", kv_heads=kv)
    grads = backward.execute(blocks.llama_backward_inputs(dy.to(device), outputs, x.to(device), on_device))
    accumulating = [exprs for scheduler, exprs in _segments(backward) if scheduler == "gemm_accumulate"]
    assert len(accumulating) == 3, backward.host_program()
    assert not any(re.fullmatch(r"(T\d+ = add\(T\d+, T\d+\)(; )?)+", exprs) for _, exprs in _segments(backward))

    params = {n: t.clone().requires_grad_(n not in ("cos", "sin")) for n, t in full.items()}
    params["x"] = x.clone().requires_grad_(True)
    blocks.llama_reference(params, h).backward(dy)
    for name, got in zip(blocks.LLAMA_GRADS, grads):
        tol = 1e-4 if device == "cpu" else 1e-3  # CUDA's float32 attention kernel sums in another order
        torch.testing.assert_close(got.cpu(), params[name].grad, atol=tol, rtol=tol, msg=name)
