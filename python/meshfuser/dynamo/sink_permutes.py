"""Elementwise work before a permute, not after it (on AOTAutograd's ATen graphs).

Requires: an ATen graph with traced values (`meta["val"]`, fake tensors). Guarantees: a pointwise
op, slice or cat whose full-size operands are all the same permute (or transpose) of tensors runs
on those tensors, with its smaller operands (broadcast tables, scalars) permuted back to match,
and the permute follows it instead; repeated, permutes move through chains of such ops towards
their consumers. Values are exactly the same.

Why: Hugging Face splits heads with `view(...).transpose(1, 2)` and then applies RoPE, so the
RoPE kernel read q and k transposed and wrote them [b, h, s, d] row-major; attention's output
follows q's layout, so the head merge after it was a copy. With the permute after RoPE, the kernel
reads and writes the projection's own [b, s, h, d] layout, attention reads it in place and writes
its output the same way, and merging the heads is a view.
"""
import torch
import torch.fx as fx

aten = torch.ops.aten

POINTWISE = {
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.neg.default, aten.exp.default,
    aten.tanh.default, aten.sigmoid.default, aten.silu.default, aten.relu.default, aten.cos.default,
    aten.sin.default, aten.rsqrt.default, aten.sqrt.default, aten.reciprocal.default, aten.abs.default,
    aten.where.self, aten.maximum.default, aten.minimum.default, aten.pow.Tensor_Scalar,
    aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
}


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def _permutation(node):
    """(source, dims) when node is a permute or transpose of a tensor, else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    val = _val(node)
    if not isinstance(val, torch.Tensor):
        return None
    rank = val.dim()
    if node.target is aten.permute.default:
        return node.args[0], [d % rank for d in node.args[1]]
    if node.target is aten.transpose.int:
        dims = list(range(rank))
        d0, d1 = node.args[1] % rank, node.args[2] % rank
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return node.args[0], dims
    return None


def _fake(target, args, kwargs):
    vals = [_val(a) for a in args if isinstance(a, fx.Node)] + \
        [_val(x) for a in args if isinstance(a, (list, tuple)) for x in a if isinstance(x, fx.Node)]
    mode = next(v.fake_mode for v in vals if hasattr(v, "fake_mode"))

    def real(a):
        if isinstance(a, fx.Node):
            return _val(a)
        if isinstance(a, (list, tuple)):
            return type(a)(real(x) for x in a)
        return a
    with mode:
        return target(*real(args), **{k: real(v) for k, v in kwargs.items()})


def _call(graph, target, args, kwargs=None):
    node = graph.call_function(target, tuple(args), kwargs or {})
    node.meta["val"] = _fake(target, args, kwargs or {})
    return node


def _operands_fit(node, dims, numel):
    """Every operand is the permute, a smaller tensor (broadcast), or not a tensor."""
    for a in node.args:
        perm = _permutation(a)
        if perm is not None and perm[1] == dims:
            continue
        val = _val(a)
        if isinstance(a, fx.Node) and not isinstance(val, torch.Tensor):
            return False
        if isinstance(val, torch.Tensor) and val.dim() > 0 and (val.dim() > len(dims) or val.numel() >= numel):
            return False  # a full-size operand laid out as it is: it would be read transposed
    return True


def _rewrite(graph, node, dims):
    """node computed on the unpermuted operands (smaller ones permuted back), then permuted."""
    inverse = [dims.index(i) for i in range(len(dims))]
    rank = len(dims)
    args = []
    for a in node.args:
        perm = _permutation(a)
        if perm is not None and perm[1] == dims:
            args.append(perm[0])
            continue
        val = _val(a)
        if isinstance(val, torch.Tensor) and val.dim() > 0:
            if val.dim() < rank:
                a = _call(graph, aten.view.default, [a, [1] * (rank - val.dim()) + list(val.shape)])
            a = _call(graph, aten.permute.default, [a, inverse])
        args.append(a)
    new = _call(graph, node.target, args, dict(node.kwargs))
    return _call(graph, aten.permute.default, [new, dims])


def _rewrite_slice(graph, node, dims):
    source, d = node.args[0], node.args[1] if len(node.args) > 1 else 0
    perm = _permutation(source)
    new = _call(graph, aten.slice.Tensor, [perm[0], dims[d % len(dims)]] + list(node.args[2:]))
    return _call(graph, aten.permute.default, [new, dims])


def _rewrite_cat(graph, node, dims):
    pieces = [_permutation(t)[0] for t in node.args[0]]
    d = node.args[1] if len(node.args) > 1 else 0
    new = _call(graph, aten.cat.default, [pieces, dims[d % len(dims)]])
    return _call(graph, aten.permute.default, [new, dims])


def _candidate(node):
    """The permutation node's full-size operands share, or None."""
    if node.op != "call_function":
        return None
    if node.target is aten.slice.Tensor:
        perm = _permutation(node.args[0])
        return perm[1] if perm else None
    if node.target is aten.cat.default:
        perms = [_permutation(t) for t in node.args[0]]
        if perms and all(p is not None and p[1] == perms[0][1] for p in perms):
            return perms[0][1]
        return None
    if node.target not in POINTWISE:
        return None
    val = _val(node)
    perms = [_permutation(a) for a in node.args if isinstance(_val(a), torch.Tensor)
             and isinstance(val, torch.Tensor) and _val(a).shape == val.shape]
    if perms and all(p is not None and p[1] == perms[0][1] for p in perms):
        return perms[0][1]
    return None


def sink_permutes(gm: fx.GraphModule):
    """Rewrites gm as the module doc says; returns gm."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        dims = _candidate(node)
        if dims is None or dims == list(range(len(dims))):
            continue
        if node.target in POINTWISE and not _operands_fit(node, dims, _val(node).numel()):
            continue
        with graph.inserting_before(node):
            if node.target is aten.slice.Tensor:
                new = _rewrite_slice(graph, node, dims)
            elif node.target is aten.cat.default:
                new = _rewrite_cat(graph, node, dims)
            else:
                new = _rewrite(graph, node, dims)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        changed = True
    if changed:
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and not node.users and node.target in (
                    aten.permute.default, aten.transpose.int, aten.view.default):
                graph.erase_node(node)
        gm.recompile()
    return gm
