"""sdpfa_fwd / sdpfa_bwd on one device against PyTorch's scaled_dot_product_attention and autograd
on the same tensors, their segments, and their user errors."""
import math

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, FusionDefinition

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=5e-3, atol=5e-3)}


def reference(q, k, v, grad, is_causal, scale):
    """Attention output, logsumexp (float64 math, independent of the fused kernels) and gradients."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    attn.backward(grad)
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q.detach().double() @ k.detach().double().transpose(-1, -2)) * s
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1).float()
    return attn.detach(), lse, q.grad, k.grad, v.grad


def random_qkv(shape_q, seq_kv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_kv = list(shape_q[:-2]) + [seq_kv, shape_q[-1]]
    q = torch.randn(shape_q, generator=g).to(dtype)
    k = torch.randn(shape_kv, generator=g).to(dtype)
    v = torch.randn(shape_kv, generator=g).to(dtype)
    grad = torch.randn(shape_q, generator=g).to(dtype)
    return q, k, v, grad


def define_fwd_bwd(fd, shape_q, seq_kv, dtype, dropout_p=None, is_causal=None, scale=None):
    shape_kv = list(shape_q[:-2]) + [seq_kv, shape_q[-1]]
    q = fd.define_tensor(shape_q, dtype=DTYPES[dtype])
    k = fd.define_tensor(shape_kv, dtype=DTYPES[dtype])
    v = fd.define_tensor(shape_kv, dtype=DTYPES[dtype])
    grad = fd.define_tensor(shape_q, dtype=DTYPES[dtype])
    attn, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    gq, gk, gv = fd.ops.sdpfa_bwd(grad, q, k, v, attn, lse, dropout_p, is_causal, seed, offset, scale=scale)
    for t in (attn, lse, gq, gk, gv):
        fd.add_output(t)
    return attn, lse, seed, offset


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scale", [None, 0.3], ids=["default_scale", "scale"])
def test_forward_and_backward_match_pytorch(dtype, is_causal, scale):
    shape_q, seq_kv = [2, 3, 5, 8], 7
    q, k, v, grad = random_qkv(shape_q, seq_kv, dtype)
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape_q, seq_kv, dtype, is_causal=is_causal, scale=scale)
    actual = fd.execute([q, k, v, grad])
    expected = reference(q, k, v, grad, is_causal, scale)
    for name, a, e in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype, (name, a.shape, e.shape, a.dtype, e.dtype)
        torch.testing.assert_close(a, e, **TOL[dtype], msg=lambda m: f"{name}: {m}")


def test_options_as_constant_scalars_like_nvfuser():
    shape_q, seq_kv = [1, 2, 6, 4], 6
    q, k, v, grad = random_qkv(shape_q, seq_kv, torch.float32, seed=1)
    with FusionDefinition() as fd:
        dropout_p = fd.define_scalar(0.0, dtype=DataType.Double)
        is_causal = fd.define_scalar(True, dtype=DataType.Bool)
        define_fwd_bwd(fd, shape_q, seq_kv, torch.float32, dropout_p=dropout_p, is_causal=is_causal)
    actual = fd.execute([q, k, v, grad])
    for a, e in zip(actual, reference(q, k, v, grad, True, None)):
        torch.testing.assert_close(a, e, **TOL[torch.float32])
    assert "sdpfa_fwd(" in str(fd) and "is_causal=true" in str(fd)


def test_backward_as_its_own_definition_from_saved_activations():
    """The forward fusion returns the saved activations (attn, logsumexp and the RNG state); a
    second fusion takes them, as nvFuser's transformer tests split forward and backward."""
    shape_q, seq_kv = [2, 2, 4, 8], 4
    q, k, v, grad = random_qkv(shape_q, seq_kv, torch.float32, seed=2)
    with FusionDefinition() as fwd:
        tq, tk, tv = (fwd.define_tensor(shape_q) for _ in range(3))
        outs = fwd.ops.sdpfa_fwd(tq, tk, tv, is_causal=True)
        for t in outs:
            fwd.add_output(t)
    attn, lse, seed, offset = fwd.execute([q, k, v])
    assert seed.dtype == torch.int64 and seed.dim() == 0 and offset.dtype == torch.int64 and offset.dim() == 0
    with FusionDefinition() as bwd:
        tg, tq, tk, tv, ta = (bwd.define_tensor(shape_q) for _ in range(5))
        tl = bwd.define_tensor(shape_q[:-1])
        ts, to = bwd.define_tensor([], dtype=DataType.Int), bwd.define_tensor([], dtype=DataType.Int)
        for t in bwd.ops.sdpfa_bwd(tg, tq, tk, tv, ta, tl, 0.0, True, ts, to):
            bwd.add_output(t)
    grads = bwd.execute([grad, q, k, v, attn, lse, seed, offset])
    expected = reference(q, k, v, grad, True, None)
    for a, e in zip([attn, lse, *grads], expected):
        torch.testing.assert_close(a, e, **TOL[torch.float32])


def test_extra_leading_axes_fold_into_the_batch():
    """[d, b, h, s, e] (the layout of a logical head split) is attention over every leading index."""
    shape_q, seq_kv = [2, 1, 3, 5, 4], 5
    q, k, v, grad = random_qkv(shape_q, seq_kv, torch.float32, seed=3)
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape_q, seq_kv, torch.float32, is_causal=True)
    actual = fd.execute([q, k, v, grad])
    for a, e in zip(actual, reference(q, k, v, grad, True, None)):
        torch.testing.assert_close(a, e, **TOL[torch.float32])


def test_attention_runs_in_a_segment_of_its_own():
    """Like a contraction, attention is its own ATen segment: the pointwise work before and after
    it forms separate segments (generated kernels on GPUs)."""
    shape = [1, 2, 4, 8]
    q, k, v, _ = random_qkv(shape, 4, torch.float32, seed=4)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor(shape) for _ in range(3))
        attn, _, _, _ = fd.ops.sdpfa_fwd(fd.ops.relu(tq), tk, tv)
        fd.add_output(fd.ops.mul(attn, 2.0))
    (out,) = fd.execute([q, k, v])
    torch.testing.assert_close(out, 2 * F.scaled_dot_product_attention(q.relu(), k, v))
    assert "deallocate" not in fd.host_program() and "deallocations not shown" in fd.host_program()
    text = fd.host_program(deallocations=True)
    segments = [line for line in text.splitlines() if line.strip().startswith("run segment")]
    assert len(segments) == 3, text
    assert "sdpfa_fwd(" in segments[1] and "relu(" not in segments[1] and "mul(" not in segments[1], text
    # The outputs nothing reads (logsumexp, seed, offset) are freed right after the segment.
    assert all(f"deallocate {t}" in text for t in ("T5", "T6", "T7")), text
    assert fd.cuda_kernels([q, k, v]) is not None  # walks the attention segment on meta tensors


# -- user errors ---------------------------------------------------------------------------------

def dropout_reference(q, k, v, grad, is_causal, dropout_p, seed):
    """Attention with the math kernel's mask: drawn on the CPU from the seed the forward returned."""
    keep = torch.empty(list(q.shape[:-1]) + [k.shape[-2]]).bernoulli_(
        1 - dropout_p, generator=torch.Generator().manual_seed(seed))
    q, k, v = (t.detach().float().cpu().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) * keep / (1 - dropout_p)) @ v
    attn.backward(grad.float().cpu())
    return attn.detach(), q.grad, k.grad, v.grad


def define_fwd_bwd_with_seed(fd, shape_q, seq_kv, dtype, dropout_p, is_causal):
    _, _, seed, _ = define_fwd_bwd(fd, shape_q, seq_kv, dtype, dropout_p=dropout_p, is_causal=is_causal)
    fd.add_output(seed)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_dropout_on_cpu_runs_the_math_kernel_with_a_mask_the_backward_redraws(is_causal):
    shape_q, seq_kv, p = [2, 3, 6, 8], 6, 0.3
    q, k, v, grad = random_qkv(shape_q, seq_kv, torch.float32, seed=7)
    with FusionDefinition() as fd:
        define_fwd_bwd_with_seed(fd, shape_q, seq_kv, torch.float32, p, is_causal)
    attn, lse, gq, gk, gv, seed = fd.execute([q, k, v, grad])
    expected = dropout_reference(q, k, v, grad, is_causal, p, int(seed))
    for name, a, e in zip(["attn", "grad_q", "grad_k", "grad_v"], [attn, gq, gk, gv], expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(lse, reference(q, k, v, grad, is_causal, None)[1])  # before dropout
    assert "sdpfa_fwd kernel: math" in fd.host_program() and "sdpfa_bwd kernel: math" in fd.host_program()
    torch.manual_seed(0)
    first = fd.execute([q, k, v, grad])
    torch.manual_seed(0)
    assert torch.equal(first[-1], fd.execute([q, k, v, grad])[-1])  # torch.manual_seed repeats the mask


def gqa_reference(q, k, v, grad, is_causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    attn.backward(grad)
    return attn.detach(), q.grad, k.grad, v.grad


def run_gqa(q, k, v, grad, is_causal):
    dtype = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}[q.dtype]
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (fd.define_tensor(list(t.shape), dtype=dtype) for t in (q, k, v, grad))
        attn, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=is_causal)
        gq, gk, gv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, attn, lse, None, is_causal, seed, offset)
        for t in (attn, gq, gk, gv):
            fd.add_output(t)
    return fd.execute([q, k, v, grad])


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_grouped_query_attention_matches_pytorch(is_causal):
    """k and v with fewer heads than q (Llama 3: 8 KV heads for 32 query heads): query head h reads
    key/value head h // (heads_q // heads_kv), as PyTorch's enable_gqa does; grad_k and grad_v sum
    over the query heads that share them."""
    g = torch.Generator().manual_seed(11)
    q, grad = torch.randn(2, 6, 5, 8, generator=g), torch.randn(2, 6, 5, 8, generator=g)
    k, v = torch.randn(2, 2, 7 if not is_causal else 5, 8, generator=g), None
    v = torch.randn(k.shape, generator=g)
    actual = run_gqa(q, k, v, grad, is_causal)
    for name, a, e in zip(["attn", "grad_q", "grad_k", "grad_v"], actual, gqa_reference(q, k, v, grad, is_causal)):
        assert a.shape == e.shape, (name, a.shape, e.shape)
        torch.testing.assert_close(a, e, **TOL[torch.float32], msg=lambda m: f"{name}: {m}")


def test_host_program_names_the_attention_kernel(monkeypatch):
    shape = [1, 2, 4, 8]
    q, k, v, grad = random_qkv(shape, 4, torch.float32, seed=8)
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape, 4, torch.float32)
    fd.execute([q, k, v, grad])
    assert "sdpfa_fwd kernel: cpu_flash" in fd.host_program(), fd.host_program()
    monkeypatch.setenv("MESHFUSER_ATTENTION_KERNEL", "math")
    actual = fd.execute([q, k, v, grad])
    assert "sdpfa_fwd kernel: math" in fd.host_program() and "sdpfa_bwd kernel: math" in fd.host_program()
    for a, e in zip(actual, reference(q, k, v, grad, False, None)):
        torch.testing.assert_close(a, e, **TOL[torch.float32])


@pytest.mark.parametrize("value, message", [
    ("flash", "MESHFUSER_ATTENTION_KERNEL=flash: on CPU tensors only math can be forced"),
    ("fastest", "MESHFUSER_ATTENTION_KERNEL: unknown kernel 'fastest'; valid kernels are cudnn, flash, efficient, math"),
])
def test_forcing_an_attention_kernel_that_cannot_run_is_a_clear_error(monkeypatch, value, message):
    shape = [1, 1, 4, 4]
    q, k, v, _ = random_qkv(shape, 4, torch.float32)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor(shape) for _ in range(3))
        fd.add_output(fd.ops.sdpfa_fwd(tq, tk, tv)[0])
    monkeypatch.setenv("MESHFUSER_ATTENTION_KERNEL", value)
    with pytest.raises(meshfuser.Error, match=message):
        fd.execute([q, k, v])


@pytest.mark.parametrize(
    "k_shape, dtype, message",
    [
        ([1, 3, 4, 4], DataType.Float, "the number of key/value heads differs: T1 has 3 at axis 1"),
        ([1, 2, 4, 8], DataType.Float, "head_dim of query and key differs"),
        ([1, 2, 4, 4], DataType.Half, "is half but query is float"),
        ([2, 4, 4], DataType.Float, "has 3 axes but query"),
    ],
    ids=["kv_heads", "head_dim", "dtype", "rank"],
)
def test_operand_errors_name_the_tensor_and_axis(k_shape, dtype, message):
    with FusionDefinition() as fd:
        q = fd.define_tensor([1, 2, 4, 4])
        k = fd.define_tensor(k_shape, dtype=dtype)
        v = fd.define_tensor([1, 2, 4, 4])
        with pytest.raises(meshfuser.Error, match=message):
            fd.ops.sdpfa_fwd(q, k, v)


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, message",
    [
        ([1, 2, 4, 4], [1, 3, 4, 4], [1, 3, 4, 4], "query T0 has 2 heads .axis 1. and key T1 has 3; grouped-query "
         "attention needs the query heads to be a multiple of the key/value heads"),
        ([1, 2, 4, 4], [1, 2, 4, 4], [1, 2, 4, 8], "head_dim of query and value differs"),
        ([1, 2, 4, 4], [1, 2, 5, 4], [1, 2, 4, 4], "the key/value sequence length differs"),
        ([4, 4], [4, 4], [4, 4], "expected \\[batch.., heads, seq, head_dim\\] .at least 3 axes."),
    ],
    ids=["gqa_heads_do_not_divide", "value_head_dim", "kv_seq", "too_few_axes"],
)
def test_shape_errors_name_both_tensors(q_shape, k_shape, v_shape, message):
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor(shape) for shape in (q_shape, k_shape, v_shape))
        with pytest.raises(meshfuser.Error, match=message):
            fd.ops.sdpfa_fwd(q, k, v)


def test_integer_operands_and_bad_options_are_argument_errors():
    with FusionDefinition() as fd:
        qi = fd.define_tensor([1, 1, 4, 4], dtype=DataType.Int)
        with pytest.raises(ValueError, match="expected float, half or bfloat16"):
            fd.ops.sdpfa_fwd(qi, qi, qi)
        q = fd.define_tensor([1, 1, 4, 4])
        with pytest.raises(ValueError, match="dropout_p is 1; expected 0 <= dropout_p < 1"):
            fd.ops.sdpfa_fwd(q, q, q, dropout_p=1.0)
        runtime_scalar = fd.define_scalar(dtype=DataType.Double)
        with pytest.raises(meshfuser.Error, match="is_causal must be known when the fusion is defined"):
            fd.ops.sdpfa_fwd(q, q, q, is_causal=runtime_scalar)
        with pytest.raises(meshfuser.Error, match="scale must be None, a number or a constant scalar"):
            fd.ops.sdpfa_fwd(q, q, q, scale="big")
        with pytest.raises(ValueError, match="scale is inf; expected a finite number or None"):
            fd.ops.sdpfa_fwd(q, q, q, scale=float("inf"))


def test_backward_checks_the_saved_activations():
    with FusionDefinition() as fd:
        q = fd.define_tensor([1, 2, 4, 4])
        attn, lse, seed, offset = fd.ops.sdpfa_fwd(q, q, q)
        with pytest.raises(meshfuser.Error, match="logsumexp .* expected float \\[batch.., heads, seq_q\\]"):
            fd.ops.sdpfa_bwd(attn, q, q, q, attn, attn, 0.0, False, seed, offset)
        with pytest.raises(meshfuser.Error, match="seed .* must be the 0-d int64 tensor sdpfa_fwd returns"):
            fd.ops.sdpfa_bwd(attn, q, q, q, attn, lse, 0.0, False, lse, offset)
        with pytest.raises(meshfuser.Error, match="grad_attn .* like sdpfa_fwd's output"):
            fd.ops.sdpfa_bwd(lse, q, q, q, attn, lse, 0.0, False, seed, offset)
        other = fd.define_tensor([1, 2, 5, 4])
        with pytest.raises(meshfuser.Error, match="a batch, head or query-sequence extent differs: T.* has 5 at axis 2"):
            fd.ops.sdpfa_bwd(attn, q, q, q, other, lse, 0.0, False, seed, offset)


# -- CUDA: flash attention (run where a GPU is present; CPU-only CI skips these) -----------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (fused attention kernels)")


@cuda
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_cuda_flash_attention_matches_pytorch(is_causal):
    shape_q, seq_kv = [2, 4, 128, 64], 128
    q, k, v, grad = (t.cuda() for t in random_qkv(shape_q, seq_kv, torch.bfloat16, seed=5))
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape_q, seq_kv, torch.bfloat16, is_causal=is_causal)
    actual = fd.execute([q, k, v, grad])
    expected = reference(q.float().cpu(), k.float().cpu(), v.float().cpu(), grad.float().cpu(), is_causal, None)
    for name, a, e in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], actual, expected):
        assert a.is_cuda
        torch.testing.assert_close(a.float().cpu(), e, rtol=2e-2, atol=2e-2, msg=lambda m: f"{name}: {m}")


@cuda
def test_cuda_dropout_state_round_trips_to_the_backward():
    """With dropout, the forward's seed and offset must reach the backward intact: same generator
    state, same mask as PyTorch's own flash attention, so outputs and gradients agree with it."""
    shape = [1, 2, 64, 64]
    q, k, v, grad = (t.cuda() for t in random_qkv(shape, 64, torch.float16, seed=6))
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape, 64, torch.float16, dropout_p=0.25)
    torch.manual_seed(123)
    attn, lse, gq, gk, gv = fd.execute([q, k, v, grad])
    torch.manual_seed(123)
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.25)
    ref_grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad, q, k, v, out[0], out[1], None, None, 64, 64, 0.25, False, out[6], out[7])
    torch.testing.assert_close(attn, out[0])
    for a, e in zip([gq, gk, gv], ref_grads):
        torch.testing.assert_close(a, e)


SDP_BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
GPU_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
           torch.float16: dict(rtol=1e-2, atol=1e-2)}


def check_on_cuda(shape_q, seq_kv, dtype, is_causal, seed=9):
    q, k, v, grad = (t.cuda() for t in random_qkv(shape_q, seq_kv, dtype, seed=seed))
    with FusionDefinition() as fd:
        define_fwd_bwd(fd, shape_q, seq_kv, dtype, is_causal=is_causal)
    actual = fd.execute([q, k, v, grad])
    expected = reference(*(t.float().cpu() for t in (q, k, v, grad)), is_causal, None)
    for name, a, e in zip(["attn", "logsumexp", "grad_q", "grad_k", "grad_v"], actual, expected):
        assert a.is_cuda and a.dtype == (torch.float32 if name == "logsumexp" else dtype), (name, a.dtype)
        torch.testing.assert_close(a.float().cpu(), e, **GPU_TOL[dtype], msg=lambda m: f"{name}: {m}")
    return fd, (q, k, v)


@cuda
@pytest.mark.parametrize("head_dim", [4, 12, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_cuda_attention_any_head_size_and_dtype_matches_pytorch(head_dim, dtype, is_causal):
    check_on_cuda([1, 2, 64, head_dim], 64 if is_causal else 80, dtype, is_causal)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_cuda_attention_runs_the_kernel_pytorch_would_pick(dtype):
    fd, (q, k, v) = check_on_cuda([2, 4, 256, 128], 256, dtype, is_causal=True)
    choice = torch._fused_sdp_choice(*(t.detach().requires_grad_() for t in (q, k, v)), is_causal=True)
    kernel = SDP_BACKENDS[choice]
    text = fd.host_program()
    assert f"sdpfa_fwd kernel: {kernel}" in text and f"sdpfa_bwd kernel: {kernel}" in text, (choice, text)


@cuda
@pytest.mark.parametrize("kernel", ["cudnn", "flash", "efficient", "math"])
@pytest.mark.parametrize("head_dim", [12, 128])
def test_cuda_each_forced_kernel_matches_pytorch(monkeypatch, kernel, head_dim):
    monkeypatch.setenv("MESHFUSER_ATTENTION_KERNEL", kernel)
    fd, _ = check_on_cuda([2, 2, 128, head_dim], 128, torch.bfloat16, is_causal=True)
    assert f"sdpfa_fwd kernel: {kernel}" in fd.host_program() and f"sdpfa_bwd kernel: {kernel}" in fd.host_program()


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_cuda_grouped_query_attention_matches_pytorch(dtype):
    g = torch.Generator().manual_seed(12)
    q, grad = (torch.randn(1, 8, 128, 64, generator=g).to(dtype).cuda() for _ in range(2))
    k, v = (torch.randn(1, 2, 128, 64, generator=g).to(dtype).cuda() for _ in range(2))
    actual = run_gqa(q, k, v, grad, True)
    expected = gqa_reference(*(t.float().cpu() for t in (q, k, v, grad)), True)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float().cpu(), e, **GPU_TOL[dtype])


@cuda
@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_cuda_grouped_query_attention_reads_the_fewer_heads(monkeypatch, kernel):
    """cuDNN and flash read k and v with their 2 heads: no copy kernel repeats them to 8 heads in
    the forward or the backward (they had cost 0.18 ms in the Llama block's forward even where the
    kernel then read the fewer heads), and the results match PyTorch's enable_gqa."""
    monkeypatch.setenv("MESHFUSER_ATTENTION_KERNEL", kernel)
    g = torch.Generator().manual_seed(13)
    q, grad = (torch.randn(1, 8, 256, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
    k, v = (torch.randn(1, 2, 256, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(2))

    def copy_kernels(k, v):
        run_gqa(q, k, v, grad, True)  # first call: a kernel may refuse once, then repeats for good
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = run_gqa(q, k, v, grad, True)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        # ATen copies only: a fill (the RNG offsets) and the sums of dk and dv over each group of
        # query heads (the gradient of any repeat, in the kernel or not) are not copies.
        copies = [n for n in kernels if n.startswith("void at::native::") and "Fill" not in n and "reduce_kernel" not in n]
        return copies, out

    # Against the same call with 8 key/value heads: no more copies.
    grouped_copies, actual = copy_kernels(k, v)
    full_copies, _ = copy_kernels(k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    assert len(grouped_copies) <= len(full_copies), (grouped_copies, full_copies)
    expected = gqa_reference(*(t.float().cpu() for t in (q, k, v, grad)), True)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float().cpu(), e, **GPU_TOL[torch.bfloat16])


@cuda
def test_cuda_float32_dropout_runs_the_math_kernel():
    shape_q, seq_kv, p = [1, 2, 32, 16], 32, 0.2
    q, k, v, grad = (t.cuda() for t in random_qkv(shape_q, seq_kv, torch.float32, seed=10))
    with FusionDefinition() as fd:
        define_fwd_bwd_with_seed(fd, shape_q, seq_kv, torch.float32, p, True)
    attn, lse, gq, gk, gv, seed = fd.execute([q, k, v, grad])
    assert "sdpfa_fwd kernel: math" in fd.host_program()
    expected = dropout_reference(q, k, v, grad, True, p, int(seed))
    for a, e in zip([attn, gq, gk, gv], expected):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["transposed_input", "permute_in_fusion"])
def test_non_contiguous_value_matches_pytorch(layout):
    # The flash kernels assume a unit stride along head_dim: a transposed v gave attention off by
    # ~2.8 with no error (forward and gradients), whether it came in transposed or a permute in the
    # fusion made it so.
    q, k, _, grad = random_qkv([2, 3, 5, 8], 7, torch.float32)
    v_t = torch.randn(2, 3, 8, 7, generator=torch.Generator().manual_seed(1))  # v, stored transposed
    v = v_t.transpose(-1, -2)
    with FusionDefinition() as fd:
        tq, tk = fd.define_tensor([2, 3, 5, 8]), fd.define_tensor([2, 3, 7, 8])
        if layout == "transposed_input":
            tv = fd.define_tensor([2, 3, 7, 8])
        else:
            tv = fd.ops.permute(fd.define_tensor([2, 3, 8, 7]), [0, 1, 3, 2])
        tg = fd.define_tensor([2, 3, 5, 8])
        attn, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv)
        gq, gk, gv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, attn, lse, None, None, seed, offset)
        for t in (attn, lse, gq, gk, gv):
            fd.add_output(t)
    got = fd.execute([q, k, v if layout == "transposed_input" else v_t, grad])  # inputs in definition order
    want = reference(q, k, v.contiguous(), grad, False, None)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL[torch.float32])


def test_empty_sequence_gives_empty_attention():
    q, k, v, _ = random_qkv([2, 3, 0, 8], 4, torch.float32)
    with FusionDefinition() as fd:
        tq, tk, tv = fd.define_tensor([2, 3, 0, 8]), fd.define_tensor([2, 3, 4, 8]), fd.define_tensor([2, 3, 4, 8])
        fd.add_output(fd.ops.sdpfa_fwd(tq, tk, tv)[0])
    (out,) = fd.execute([q, k, v])
    assert out.shape == (2, 3, 0, 8)


def test_no_keys_for_a_non_empty_query_is_an_error():
    q, k, v, _ = random_qkv([2, 3, 4, 8], 0, torch.float32)
    with FusionDefinition() as fd:
        tq, tk, tv = fd.define_tensor([2, 3, 4, 8]), fd.define_tensor([2, 3, 0, 8]), fd.define_tensor([2, 3, 0, 8])
        fd.add_output(fd.ops.sdpfa_fwd(tq, tk, tv)[0])
    with pytest.raises(meshfuser.Error, match="has no keys"):
        fd.execute([q, k, v])
