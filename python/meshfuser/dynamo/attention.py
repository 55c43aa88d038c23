"""Attention: PyTorch's fused attention ops -> meshfuser's sdpfa_fwd / sdpfa_bwd.

On CPU the graph holds `_scaled_dot_product_flash_attention_for_cpu` and its backward, which
translate directly. On CUDA, PyTorch's flash attention returns, beside the output and logsumexp,
sequence offsets, maximal lengths and its random-number state, which the backward takes again.
Without dropout none of them matters, so `prepare_attention` (run on every graph before
partitioning) replaces the pair by `meshfuser::attention` / `meshfuser::attention_backward`, which
take and return tensors only: meshfuser runs them, or ATen runs PyTorch's flash kernels for them.
Tracing prefers flash attention (`flash_first`), so that the graph holds the kernel meshfuser has.
Grouped-query attention (fewer key/value heads) goes to sdpfa as it is (meshfuser takes it).
"""
import contextlib
import operator
from typing import Optional

import torch
import torch.fx as fx

from .aten_ops import _op

aten = torch.ops.aten


def flash_first():
    """The context under which graphs are traced: flash attention where it applies."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                            SDPBackend.MATH], set_priority=True)
    except (ImportError, TypeError, AttributeError):
        return contextlib.nullcontext()


# -- meshfuser::attention (CUDA flash attention without dropout) -------------------------------------

def _repeat(kv, heads):
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _fold(grad, kv_heads):
    b, heads, s, d = grad.shape
    return grad if heads == kv_heads else grad.view(b, kv_heads, heads // kv_heads, s, d).sum(2)


@torch.library.custom_op("meshfuser::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    heads = q.shape[1]
    out = aten._scaled_dot_product_flash_attention(q, _repeat(k, heads), _repeat(v, heads), 0.0, is_causal, False,
                                                   scale=scale)
    return out[0], out[1]


@attention.register_fake
def _attention_fake(q, k, v, is_causal, scale):
    b, h, s, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("meshfuser::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, is_causal: bool,
                       scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    heads, kv_heads = q.shape[1], k.shape[1]
    empty = torch.empty(0, dtype=torch.int32, device=q.device)
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    gq, gk, gv = aten._scaled_dot_product_flash_attention_backward(
        grad, q, _repeat(k, heads), _repeat(v, heads), out, lse, empty, empty, q.shape[2], k.shape[2], 0.0, is_causal,
        zero, zero, scale=scale)
    return gq, _fold(gk, kv_heads), _fold(gv, kv_heads)


@attention_backward.register_fake
def _attention_backward_fake(grad, q, k, v, out, lse, is_causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


ATTENTION = torch.ops.meshfuser.attention.default
ATTENTION_BACKWARD = torch.ops.meshfuser.attention_backward.default
_FLASH = aten._scaled_dot_product_flash_attention.default
_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_backward.default


def _arg(node, i, name, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def prepare_attention(gm: fx.GraphModule):
    """CUDA flash attention without dropout -> meshfuser::attention(_backward); the extra results
    the forward returned (kept as graph outputs, saved for the backward) become empty tensors on
    ATen (without dropout the backward reads none of them)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _FLASH and not _arg(node, 3, "dropout_p", 0.0) and not _arg(node, 5, "return_debug_mask",
                                                                                         False):
            with graph.inserting_before(node):
                new = graph.call_function(ATTENTION, tuple(node.args[:3]) + (
                    _arg(node, 4, "is_causal", False), node.kwargs.get("scale")))
            val = node.meta.get("val")
            new.meta["val"] = (val[0], val[1]) if val is not None else None
            for user in list(node.users):
                index = user.args[1]
                if index in (0, 1):
                    with graph.inserting_after(new):
                        got = graph.call_function(operator.getitem, (new, index))
                    got.meta = dict(user.meta)
                    user.replace_all_uses_with(got)
                else:
                    uval = user.meta.get("val")
                    if isinstance(uval, torch.Tensor):
                        with graph.inserting_before(user):  # any values: without dropout nothing reads them
                            got = graph.call_function(aten.empty.memory_format, (list(uval.shape),),
                                                      {"dtype": uval.dtype, "device": uval.device})
                        got.meta = dict(user.meta)
                        user.replace_all_uses_with(got)
                    else:
                        user.replace_all_uses_with(uval)
                graph.erase_node(user)
            graph.erase_node(node)
        elif node.target is _FLASH_BACKWARD and not node.args[10]:
            grad, q, k, v, out, lse = node.args[:6]
            with graph.inserting_before(node):
                new = graph.call_function(ATTENTION_BACKWARD, (grad, q, k, v, out, lse, node.args[11],
                                                               node.kwargs.get("scale")))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
    gm.recompile()
    return gm


# -- translations -------------------------------------------------------------------------------------

def _four_d(node):
    return all(a.meta["val"].dim() == 4 for a in node.args[:3])


def _attention_check(node):
    if node.kwargs.get("attn_mask") is not None:
        return "attention with an explicit mask (meshfuser takes is_causal only)"
    dropout = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    if dropout:
        return "attention dropout on CPU"
    return None if _four_d(node) else "attention on tensors that are not [batch, heads, seq, dim]"


@_op(aten._scaled_dot_product_flash_attention_for_cpu.default, check=_attention_check)
def _attention_cpu(b, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    out, lse, _seed, _offset = b.ops.sdpfa_fwd(q, k, v, dropout_p, is_causal, scale)
    return [out, lse]


def _attention_bwd_check(node):
    if node.kwargs.get("attn_mask") is not None:
        return "attention with an explicit mask (meshfuser takes is_causal only)"
    if node.args[6]:
        return "attention dropout on CPU"
    return None if all(a.meta["val"].dim() == 4 for a in node.args[:4]) else \
        "attention on tensors that are not [batch, heads, seq, dim]"


@_op(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, check=_attention_bwd_check)
def _attention_cpu_bwd(b, grad, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    seed = b.constant_input(torch.zeros((), dtype=torch.int64, device=b.device))
    offset = b.constant_input(torch.zeros((), dtype=torch.int64, device=b.device))
    return list(b.ops.sdpfa_bwd(grad, q, k, v, out, lse, dropout_p, is_causal, seed, offset, scale))


def _meshfuser_attention_check(node):
    return None if all(a.meta["val"].dim() == 4 for a in node.args[:3]) else \
        "attention on tensors that are not [batch, heads, seq, dim]"


@_op(ATTENTION, check=_meshfuser_attention_check)
def _attention(b, q, k, v, is_causal, scale):
    out, lse, _seed, _offset = b.ops.sdpfa_fwd(q, k, v, 0.0, is_causal, scale)
    return [out, lse]


@_op(ATTENTION_BACKWARD, check=_meshfuser_attention_check)
def _attention_backward(b, grad, q, k, v, out, lse, is_causal, scale):
    return _attention_cpu_bwd(b, grad, q, k, v, out, lse, 0.0, is_causal, scale=scale)
