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

def test_dropout_on_cpu_is_a_clear_error():
    shape = [1, 1, 4, 4]
    q, k, v, _ = random_qkv(shape, 4, torch.float32)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor(shape) for _ in range(3))
        fd.add_output(fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=0.1)[0])
    with pytest.raises(meshfuser.Error, match="dropout_p = 0.1 on CPU tensors is not supported"):
        fd.execute([q, k, v])


@pytest.mark.parametrize(
    "k_shape, dtype, message",
    [
        ([1, 1, 4, 4], DataType.Float, "a batch or head extent .grouped-query heads are not supported."),
        ([1, 2, 4, 8], DataType.Float, "head_dim of query and key differs"),
        ([1, 2, 4, 4], DataType.Half, "is half but query is float"),
        ([2, 4, 4], DataType.Float, "has 3 axes but query"),
    ],
    ids=["gqa_heads", "head_dim", "dtype", "rank"],
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
        ([1, 2, 4, 4], [1, 2, 4, 4], [1, 2, 4, 8], "head_dim of query and value differs"),
        ([1, 2, 4, 4], [1, 2, 5, 4], [1, 2, 4, 4], "the key/value sequence length differs"),
        ([4, 4], [4, 4], [4, 4], "expected \\[batch.., heads, seq, head_dim\\] .at least 3 axes."),
    ],
    ids=["value_head_dim", "kv_seq", "too_few_axes"],
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

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (flash attention)")


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


@cuda
def test_cuda_float32_is_a_clear_error():
    shape = [1, 1, 16, 16]
    q = torch.randn(shape, device="cuda")
    with FusionDefinition() as fd:
        tq = fd.define_tensor(shape)
        fd.add_output(fd.ops.sdpfa_fwd(tq, tq, tq)[0])
    with pytest.raises(meshfuser.Error, match="must be half or bfloat16"):
        fd.execute([q])


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
