"""Attention calls as the model meant them, on Dynamo's graph (before AOTAutograd).

Requires: a Dynamo graph (torch-level calls, `example_value` on the nodes). Guarantees: a
`scaled_dot_product_attention` whose mask is computed from constants alone (aranges and
comparisons, no graph input) and is the causal mask becomes `is_causal=True` without a mask (or
plain attention when the mask lets everything through); key/value heads repeated for grouped-query
attention (`x[:, :, None].expand(...).reshape(...)`, `repeat_kv` in Hugging Face) go to attention
unrepeated with `enable_gqa=True`. Both give exactly eager's values.

Why: some models (transformers 5.17 under tracing) materialize the causal mask and then repeat the
key/value heads, because PyTorch's kernels take grouped-query heads only without a mask. meshfuser's
sdpfa takes `is_causal` and grouped heads but no mask operand, so a materialized mask would keep
attention (forward and backward) on ATen and the repeats would copy keys and values. A mask that
depends on the inputs (padding) is left as it is: that attention stays on ATen (the partitions
report says so).
"""
import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

SDPA = torch._C._nn.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_RESHAPES = ("reshape", "view")


def _val(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None


def _static(val):
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)


_IN_PLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.iand, operator.ior,
             operator.ixor, operator.setitem}


def _mutates(node):
    if node.op == "call_function" and node.target in _IN_PLACE:
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.startswith("__")


def _constant_ancestors(node):
    """The nodes `node` is computed from, in graph order, or None when one of them is an input
    (or has a symbolic shape, or is not a plain call)."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op not in ("call_function", "call_method"):
            return None
        val = _val(n)
        if isinstance(val, torch.Tensor) and not _static(val):
            return None
        if any(_mutates(u) for u in n.users):  # a value changed in place: not what its node computed
            return None
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def _evaluate(gm, node):
    """The value of a node computed from constants only (a small graph run once, eagerly)."""
    nodes = _constant_ancestors(node)
    if nodes is None:
        return None
    graph, env = fx.Graph(), {}
    for n in nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[node])
    with unset_fake_temporarily(), torch.no_grad():
        try:
            return fx.GraphModule(gm, graph)()
        except Exception:  # not evaluable here (another device, ...): the mask stays
            return None


def mask_kind(mask, q_len, k_len):
    """"causal" (lower triangle, PyTorch's is_causal), "none" (everything attended) or None (any
    other mask) for a boolean or additive mask broadcast against [..., q_len, k_len]."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or tuple(mask.shape[-2:]) != (q_len, k_len):
        return None
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        # Masked entries must be -inf or the dtype's lowest value: after the softmax they are 0.
        if not bool((allowed | (mask <= torch.finfo(mask.dtype).min)).all()):
            return None
    else:
        return None
    if bool(allowed.all()):
        return "none"
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool((allowed == causal).all()) else None


def _unrepeated(node):
    """(x, repeats) when node is x[:, :, None].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)
    (the heads of x repeated, each n times in a row), else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_method" and node.target in _RESHAPES):
        return None
    expand = node.args[0]
    if not (isinstance(expand, fx.Node) and expand.op == "call_method" and expand.target == "expand"):
        return None
    inserted = expand.args[0]
    if not isinstance(inserted, fx.Node):
        return None
    x = _inserted_axis_2(inserted)
    vals = [_val(n) for n in (x, expand, node)] if x is not None else [None]
    if not all(_static(v) for v in vals):
        return None
    xv, ev, rv = vals
    b, kv, s, d = (list(xv.shape) + [None] * 4)[:4] if xv.dim() == 4 else (None,) * 4
    if b is None or list(ev.shape) != [b, kv, ev.shape[2], s, d] or list(rv.shape) != [b, kv * ev.shape[2], s, d]:
        return None
    return x, ev.shape[2]


def _inserted_axis_2(node):
    """x when node is x[:, :, None] or x.unsqueeze(2) of a 4-D x, else None."""
    if node.op == "call_method" and node.target == "unsqueeze" and list(node.args[1:]) in ([2], [-3]):
        return node.args[0] if isinstance(node.args[0], fx.Node) else None
    if node.op == "call_function" and node.target.__name__ == "getitem" and isinstance(node.args[1], tuple):
        full = slice(None, None, None)
        if node.args[1] in ((full, full, None), (full, full, None, full, full), (full, full, None, Ellipsis)):
            return node.args[0] if isinstance(node.args[0], fx.Node) else None
    return None


def _sdpa_kwargs(node):
    kwargs = dict(zip(_SDPA_ARGS, node.args))
    kwargs.update(node.kwargs)
    return kwargs


def _erase_unused(node):
    """Erases node when nothing uses it any more, then its inputs that became unused."""
    if node.users or node.op not in ("call_function", "call_method"):
        return
    inputs = node.all_input_nodes
    node.graph.erase_node(node)
    for n in inputs:
        _erase_unused(n)


def _rewrite(node):
    """The call's arguments as meant, or None when they stay."""
    kwargs = _sdpa_kwargs(node)
    q, k, v = (_val(kwargs.get(n)) for n in ("query", "key", "value"))
    if not (_static(q) and _static(k) and _static(v)) or q.dim() != 4:
        return None
    changed = False
    mask = kwargs.get("attn_mask")
    if isinstance(mask, fx.Node) and not kwargs.get("is_causal", False):
        kind = mask_kind(_evaluate(node.graph.owning_module, mask), q.shape[2], k.shape[2])
        if kind is not None:
            kwargs["attn_mask"], kwargs["is_causal"] = None, kind == "causal"
            changed = True
    if kwargs.get("attn_mask") is None:
        key, value = _unrepeated(kwargs["key"]), _unrepeated(kwargs["value"])
        if key is not None and value is not None and key[1] == value[1]:
            kwargs["key"], kwargs["value"], kwargs["enable_gqa"] = key[0], value[0], True
            changed = True
    return kwargs if changed else None


def attention_as_meant(gm: fx.GraphModule):
    """gm with its attention calls rewritten as described above: a new GraphModule when something
    changed (Dynamo's graph stays as it is), else gm itself."""
    if not any(n.op == "call_function" and n.target is SDPA for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    new = fx.GraphModule(gm, graph)
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not SDPA:
            continue
        kwargs = _rewrite(node)
        if kwargs is None:
            continue
        old = [a for a in node.all_input_nodes]
        node.args = tuple(kwargs.pop(n) for n in _SDPA_ARGS[:3])
        node.kwargs = kwargs
        for n in old:
            _erase_unused(n)
        changed = True
    if not changed:
        return gm
    new.recompile()
    return new
