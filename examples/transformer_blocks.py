"""Transformer blocks as meshfuser definitions, sharded the Megatron way, with PyTorch references.

GPT block: LayerNorm -> column-parallel q/k/v -> causal attention on this rank's heads ->
row-parallel output projection -> residual -> LayerNorm -> column-parallel GELU MLP -> row-parallel
projection -> residual.  Llama-style block (bias-free): RMSNorm -> column-parallel q/k/v (grouped-query:
fewer key/value heads) -> RoPE -> causal attention -> row-parallel output projection -> residual ->
RMSNorm -> column-parallel SiLU-gated MLP -> row-parallel down projection -> residual.

Forms: "tp" keeps activations replicated (an Allreduce after each row-parallel linear); "sp" splits
them on the sequence (an Allgather before each column-parallel part, a ReduceScatter after each
row-parallel linear).  Each backward is its own definition from the forward's saved activations;
its communications mirror the forward's.

Saved activations keep their producer's layout: q, k, v and the attention output are saved with
their heads merged ([b, s, heads * head_dim], what the projections write and read), so splitting and
merging heads in the backward are views and the attention kernels read and write the
[b, s, heads, head_dim] layout in place: no copies between the GEMMs and attention.

Conventions shared with meshfuser.dtensor.compile(define, backward=...):
* the forward's outputs are the block output followed by the saved activations (GPT_SAVED);
* the backward's inputs are the output gradient, the saved activations, then the forward's inputs;
  its outputs are one gradient per forward input, in order.
"""
import torch
import torch.nn.functional as F

from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType

EPS = 1e-5

GPT_PARAMS = ["x", "ln0_w", "ln0_b", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_w", "ln1_b",
              "w1", "b1", "w2", "b2"]
# What the backward reads, in the forward's output order after the block output. ln0 and ln1 are
# kept whole (already gathered in SP form), so the backward's weight gradients need no Allgather.
GPT_SAVED = ["ln0", "q", "k", "v", "attn", "lse", "seed", "offset", "res0", "ln1", "pre"]
LLAMA_PARAMS = ["x", "cos", "sin", "norm0_w", "wq", "wk", "wv", "wo", "norm1_w", "w_gate", "w_up", "w_down"]
# q and k after RoPE (what attention read); gate and up: the MLP's two projections before SiLU.
LLAMA_SAVED = ["normed0", "q", "k", "v", "attn", "lse", "seed", "offset", "res0", "normed1", "gate", "up", "gated"]

# Column-parallel weights and biases split their output features, row-parallel weights their input
# features; everything else is replicated (TP) or, for activations, split on the sequence (SP).
GPT_SPLIT = {"wq": 0, "bq": 0, "wk": 0, "bk": 0, "wv": 0, "bv": 0, "w1": 0, "b1": 0, "wo": 1, "w2": 1}
LLAMA_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "w_gate": 0, "w_up": 0, "wo": 1, "w_down": 1}
SEQUENCE_AXIS = 1
FORMS = ("tp", "sp")

_TORCH_TO_MESHFUSER = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
                       torch.float16: DataType.Half, torch.float64: DataType.Double}


def to_meshfuser_dtype(torch_dtype):
    if torch_dtype not in _TORCH_TO_MESHFUSER:
        raise ValueError(f"no meshfuser dtype for {torch_dtype}; expected one of {list(_TORCH_TO_MESHFUSER)}")
    return _TORCH_TO_MESHFUSER[torch_dtype]


def _check_form(form):
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")


# ---- parameters and their shards ------------------------------------------------------------------

def gpt_shapes(b, s, e):
    return {"x": [b, s, e], "ln0_w": [e], "ln0_b": [e], "wq": [e, e], "bq": [e], "wk": [e, e], "bk": [e],
            "wv": [e, e], "bv": [e], "wo": [e, e], "bo": [e], "ln1_w": [e], "ln1_b": [e], "w1": [4 * e, e],
            "b1": [4 * e], "w2": [e, 4 * e], "b2": [e]}


def llama_shapes(b, s, e, hd, ffn, kv_heads=None):
    """kv_heads: key/value heads (grouped-query attention); None: as many as the query heads."""
    kv = e if kv_heads is None else kv_heads * hd
    return {"x": [b, s, e], "cos": [s, hd], "sin": [s, hd], "norm0_w": [e], "wq": [e, e], "wk": [kv, e],
            "wv": [kv, e], "wo": [e, e], "norm1_w": [e], "w_gate": [ffn, e], "w_up": [ffn, e], "w_down": [e, ffn]}


def _random(shapes, seed, dtype):
    """The same unsharded tensors on every rank: weights scaled by fan-in^-1/2, the rest N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(shape, generator=g) * (shape[-1] ** -0.5 if n[0] == "w" else 1.0)).to(dtype)
            for n, shape in shapes.items()}


def gpt_parameters(b, s, e, seed=0, dtype=torch.float32):
    """The unsharded GPT block input "x" and parameters, from a seed."""
    return _random(gpt_shapes(b, s, e), seed, dtype)


def rope_tables(s, hd, base=10000.0, dtype=torch.float32):
    """cos and sin of the rotary angles, [s, hd] (the two halves repeat, as rotate_half wants)."""
    inv_freq = base ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def llama_parameters(b, s, e, hd, ffn, seed=0, dtype=torch.float32, kv_heads=None):
    """The unsharded Llama-style block input "x", RoPE tables and parameters, from a seed."""
    params = _random(llama_shapes(b, s, e, hd, ffn, kv_heads), seed, dtype)
    params["cos"], params["sin"] = rope_tables(s, hd, dtype=dtype)
    return params


def _split_axes(split, form):
    _check_form(form)
    return {**split, "x": SEQUENCE_AXIS} if form == "sp" else dict(split)


def _shard(full, split, d, rank):
    mesh = DeviceMesh(range(d))
    return {n: mesh.shard_tensor(t, split[n], rank) if n in split else t for n, t in full.items()}


def gpt_shard(full, form, d, rank):
    """This rank's part of every GPT tensor (incl. the local "x") for the form on d ranks."""
    return _shard(full, _split_axes(GPT_SPLIT, form), d, rank)


def llama_shard(full, form, d, rank):
    return _shard(full, _split_axes(LLAMA_SPLIT, form), d, rank)


def gpt_forward_inputs(x, local):
    return [x] + [local[n] for n in GPT_PARAMS[1:]]


def gpt_backward_inputs(grad, forward_outputs, x, local):
    """The backward definition's inputs: the output gradient, the saved activations (the forward's
    outputs after the first), then the forward's inputs."""
    return [grad] + list(forward_outputs[1:]) + gpt_forward_inputs(x, local)


def llama_forward_inputs(x, local):
    return [x] + [local[n] for n in LLAMA_PARAMS[1:]]


def llama_backward_inputs(grad, forward_outputs, x, local):
    """As gpt_backward_inputs, for a Llama forward defined with save=True."""
    return [grad] + list(forward_outputs[1:]) + llama_forward_inputs(x, local)


# ---- building blocks of definitions ----------------------------------------------------------------

def _float(fd, t, dtype):
    """Statistics in float32 whatever the activation dtype."""
    return t if dtype == DataType.Float else fd.ops.cast(t, DataType.Float)


def _back(fd, t, dtype):
    return t if dtype == DataType.Float else fd.ops.cast(t, dtype)


def _layer_norm_stats(fd, x, e):
    """(x - mean) and 1/sqrt(var + EPS) over the last axis of [b, s, e], from sum/sub/mul/rsqrt."""
    mean = fd.ops.div(fd.ops.sum(x, [2], keepdim=True), float(e))
    centered = fd.ops.sub(x, mean)
    var = fd.ops.div(fd.ops.sum(fd.ops.mul(centered, centered), [2], keepdim=True), float(e))
    return centered, fd.ops.rsqrt(fd.ops.add(var, EPS))


def layer_norm(fd, x, w, b, e, dtype=DataType.Float):
    centered, rstd = _layer_norm_stats(fd, _float(fd, x, dtype), e)
    return _back(fd, fd.ops.add(fd.ops.mul(fd.ops.mul(centered, rstd), w), b), dtype)


def rms_norm(fd, x, w, e, dtype=DataType.Float):
    xf = _float(fd, x, dtype)
    mean_square = fd.ops.div(fd.ops.sum(fd.ops.mul(xf, xf), [2], keepdim=True), float(e))
    return _back(fd, fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(mean_square, EPS))), w), dtype)


def split_heads(fd, t, b, s, h, hd):
    """[b, s, h*hd] -> [b, h, s, hd]."""
    return fd.ops.permute(fd.ops.reshape(t, [b, s, h, hd]), [0, 2, 1, 3])


def merge_heads(fd, t, b, s, e):
    """[b, h, s, hd] -> [b, s, h*hd]."""
    return fd.ops.reshape(fd.ops.permute(t, [0, 2, 1, 3]), [b, s, e])


def _halves(fd, t, hd):
    """The two halves of t's last axis (head_dim)."""
    shape, rank = list(t.shape), len(t.shape)
    first = fd.ops.slice(t, [0] * rank, shape[:-1] + [hd // 2])
    second = fd.ops.slice(t, [0] * (rank - 1) + [hd // 2], shape[:-1] + [hd])
    return first, second


def rotary(fd, t, cos, sin, hd):
    """RoPE: t * cos + rotate_half(t) * sin, rotate_half = cat(-t[hd/2:], t[:hd/2]) on the last axis;
    cos and sin broadcast against t ([b, h, s, hd] with [s, hd] tables, [b, s, h, hd] with [s, 1, hd])."""
    first, second = _halves(fd, t, hd)
    rotated = fd.ops.cat([fd.ops.neg(second), first], len(t.shape) - 1)
    return fd.ops.add(fd.ops.mul(t, cos), fd.ops.mul(rotated, sin))


def rotary_backward(fd, dy, cos, sin, hd):
    """rotary's input gradient: dy * cos + rotate_half^T(dy * sin), rotate_half^T(g) =
    cat(g[hd/2:], -g[:hd/2]) (rotate_half is a signed permutation; this is its transpose)."""
    first, second = _halves(fd, fd.ops.mul(dy, sin), hd)
    return fd.ops.add(fd.ops.mul(dy, cos), fd.ops.cat([second, fd.ops.neg(first)], len(dy.shape) - 1))


def _annotate(fd_tensors, mesh, split):
    for n, tv in fd_tensors.items():
        tv.set_device_mesh(mesh)
        if n in split:
            _split_on_mesh(tv, split[n], mesh)


def _split_on_mesh(tv, axis, mesh):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


def _gather(fd, t, mesh):
    """A whole copy of t on every rank: an Allgather when t is split (SP), nothing otherwise. With no
    mesh (DTensor definitions, unsharded runs) propagation decides."""
    if mesh is None:
        return t
    whole = fd.ops.set(t)
    whole.set_device_mesh(mesh)
    return whole


# ---- GPT block -------------------------------------------------------------------------------------

def define_gpt_forward(fd, b, s, h, hd, dtype=DataType.Float, mesh=None, form="tp", save=True):
    """The GPT block forward in fd: inputs GPT_PARAMS, outputs the block output then (save=True, for
    a training step's backward) GPT_SAVED.
    With a mesh, the activations between the parts carry the form's sharding (SP: ln0/ln1 gathered,
    the row-parallel results reduce-scattered on the sequence); without, only the inputs will."""
    e = h * hd
    t = {n: fd.define_tensor(shape, dtype=dtype) for n, shape in gpt_shapes(b, s, e).items()}
    sp = mesh is not None and form == "sp"
    ln0 = _gather(fd, layer_norm(fd, t["x"], t["ln0_w"], t["ln0_b"], e, dtype), mesh if sp else None)
    flat = [fd.ops.linear(ln0, t[f"w{n}"], t[f"b{n}"]) for n in "qkv"]
    attn, lse, seed, offset = fd.ops.sdpfa_fwd(*(split_heads(fd, tv, b, s, h, hd) for tv in flat), is_causal=True)
    attn_flat = merge_heads(fd, attn, b, s, e)
    proj = fd.ops.linear(attn_flat, t["wo"], t["bo"])
    res0 = fd.ops.add(t["x"], proj)
    ln1 = _gather(fd, layer_norm(fd, res0, t["ln1_w"], t["ln1_b"], e, dtype), mesh if sp else None)
    pre = fd.ops.linear(ln1, t["w1"], t["b1"])
    mlp = fd.ops.linear(fd.ops.gelu(pre), t["w2"], t["b2"])
    out = fd.ops.add(res0, mlp)
    for tv in (out, ln0, *flat, attn_flat, lse, seed, offset, res0, ln1, pre) if save else (out,):
        fd.add_output(tv)
    if mesh is not None:
        _annotate(t, mesh, _split_axes(GPT_SPLIT, form))
        if sp:  # the row-parallel results come out split on the sequence: ReduceScatter
            _split_on_mesh(proj, SEQUENCE_AXIS, mesh)
            _split_on_mesh(mlp, SEQUENCE_AXIS, mesh)
    return t


def gpt_forward_definition(b, s, h, hd, d, form, dtype=DataType.Float, save=True):
    """A FusionDefinition of the GPT block forward on d ranks (h: all heads, hd: head size);
    save=False: the block output alone (inference)."""
    _check_form(form)
    fd = FusionDefinition()
    with fd:
        define_gpt_forward(fd, b, s, h, hd, dtype, DeviceMesh(range(d)), form, save)
    return fd


def layer_norm_backward(fd, dy, x, w, e, dtype):
    """dx, dw, db of LayerNorm over the last axis (statistics recomputed from x)."""
    dy, x = _float(fd, dy, dtype), _float(fd, x, dtype)
    centered, rstd = _layer_norm_stats(fd, x, e)
    xhat = fd.ops.mul(centered, rstd)
    dw = fd.ops.sum(fd.ops.mul(dy, xhat), [0, 1])
    db = fd.ops.sum(dy, [0, 1])
    dxhat = fd.ops.mul(dy, w)
    mean_dxhat = fd.ops.div(fd.ops.sum(dxhat, [2], keepdim=True), float(e))
    mean_dxhat_xhat = fd.ops.div(fd.ops.sum(fd.ops.mul(dxhat, xhat), [2], keepdim=True), float(e))
    dx = fd.ops.mul(rstd, fd.ops.sub(fd.ops.sub(dxhat, mean_dxhat), fd.ops.mul(xhat, mean_dxhat_xhat)))
    return _back(fd, dx, dtype), _back(fd, dw, dtype), _back(fd, db, dtype)


def gelu_backward(fd, dy, x):
    """dy * gelu'(x) for the exact (erf) GELU: Phi(x) + x * phi(x)."""
    cdf = fd.ops.mul(fd.ops.add(fd.ops.erf(fd.ops.mul(x, 0.5 ** 0.5)), 1.0), 0.5)
    pdf = fd.ops.mul(fd.ops.exp(fd.ops.mul(fd.ops.mul(x, x), -0.5)), (2 * torch.pi) ** -0.5)
    return fd.ops.mul(dy, fd.ops.add(cdf, fd.ops.mul(x, pdf)))


def linear_backward(fd, dy, x, w, rows, bias=True):
    """dx, dw, db (None without a bias) of linear(x, w, b) on [b, s, .] activations (rows = b * s).
    dw reads dy and x in place: the transpose is the GEMM's layout flag, not a copy."""
    n_out, n_in = w.shape
    dx = fd.ops.matmul(dy, w)
    dw = fd.ops.matmul(fd.ops.permute(fd.ops.reshape(dy, [rows, n_out]), [1, 0]), fd.ops.reshape(x, [rows, n_in]))
    return dx, dw, fd.ops.sum(dy, [0, 1]) if bias else None


def define_gpt_backward(fd, b, s, h, hd, dtype=DataType.Float, mesh=None, form="tp"):
    """The GPT block backward in fd: inputs dy, GPT_SAVED, GPT_PARAMS; outputs one gradient per
    GPT_PARAMS entry. SP mirrors the forward: the gradient is gathered before each row-parallel
    linear's backward (the forward's ReduceScatter) and the column-parallel input gradients are
    reduce-scattered (the forward's Allgather); LayerNorm weight gradients, partial per sequence
    shard, are Allreduced. The column-parallel input gradients are partial sums: the planner adds
    the q, k and v ones before one Allreduce (TP) or ReduceScatter (SP) (sum_partials)."""
    e, rows = h * hd, b * s
    shapes = gpt_shapes(b, s, e)
    saved_shapes = {"ln0": [b, s, e], "q": [b, s, e], "k": [b, s, e], "v": [b, s, e], "attn": [b, s, e],
                    "lse": [b, h, s], "res0": [b, s, e], "ln1": [b, s, e], "pre": [b, s, 4 * e]}
    dy = fd.define_tensor([b, s, e], dtype=dtype)
    t = {}
    for n in GPT_SAVED:
        if n in ("seed", "offset"):
            t[n] = fd.define_tensor([], dtype=DataType.Int)
        else:
            # Attention's logsumexp stays float32 whatever the activations' dtype.
            t[n] = fd.define_tensor(saved_shapes[n], dtype=DataType.Float if n == "lse" else dtype)
    p = {n: fd.define_tensor(shape, dtype=dtype) for n, shape in shapes.items()}
    sp = mesh is not None and form == "sp"
    gather = (lambda tv: _gather(fd, tv, mesh)) if sp else (lambda tv: tv)  # noqa: E731
    partial_outputs = []  # column-parallel input gradients: ReduceScatter (SP) or Allreduce (TP)

    # MLP: out = res0 + linear(gelu(pre), w2, b2), pre = linear(ln1, w1, b1).
    dy_whole = gather(dy)
    d_act, d_w2, d_b2 = linear_backward(fd, dy_whole, fd.ops.gelu(t["pre"]), p["w2"], rows)
    d_pre = gelu_backward(fd, d_act, t["pre"])
    d_ln1, d_w1, d_b1 = linear_backward(fd, d_pre, t["ln1"], p["w1"], rows)
    partial_outputs.append(d_ln1)
    d_res0, d_ln1_w, d_ln1_b = layer_norm_backward(fd, d_ln1, t["res0"], p["ln1_w"], e, dtype)
    d_res0 = fd.ops.add(d_res0, dy)
    # Attention: res0 = x + linear(merge_heads(attn), wo, bo).
    d_res0_whole = gather(d_res0)
    d_attn_flat, d_wo, d_bo = linear_backward(fd, d_res0_whole, t["attn"], p["wo"], rows)
    heads = {n: split_heads(fd, t[n], b, s, h, hd) for n in ("q", "k", "v", "attn")}
    grads = fd.ops.sdpfa_bwd(split_heads(fd, d_attn_flat, b, s, h, hd), heads["q"], heads["k"], heads["v"],
                             heads["attn"], t["lse"], 0.0, True, t["seed"], t["offset"])
    d_ln0, d_proj = None, {}
    for n, grad in zip("qkv", grads):
        flat = merge_heads(fd, grad, b, s, e)
        d_in, d_proj[f"w{n}"], d_proj[f"b{n}"] = linear_backward(fd, flat, t["ln0"], p[f"w{n}"], rows)
        partial_outputs.append(d_in)
        d_ln0 = d_in if d_ln0 is None else fd.ops.add(d_ln0, d_in)
    d_x, d_ln0_w, d_ln0_b = layer_norm_backward(fd, d_ln0, p["x"], p["ln0_w"], e, dtype)
    d_x = fd.ops.add(d_x, d_res0)
    results = {"x": d_x, "ln0_w": d_ln0_w, "ln0_b": d_ln0_b, **d_proj, "wo": d_wo, "bo": d_bo,
               "ln1_w": d_ln1_w, "ln1_b": d_ln1_b, "w1": d_w1, "b1": d_b1, "w2": d_w2, "b2": d_b2}
    for n in GPT_PARAMS:
        fd.add_output(results[n])
    if mesh is not None:
        split = _split_axes(GPT_SPLIT, form)
        if sp:
            split.update(dy=SEQUENCE_AXIS, res0=SEQUENCE_AXIS)
        split.update(q=2, k=2, v=2, attn=2, lse=1, pre=2)  # heads, and the MLP's hidden features
        _annotate({"dy": dy, **t, **p}, mesh, split)
        if sp:
            for tv in partial_outputs:
                _split_on_mesh(tv, SEQUENCE_AXIS, mesh)
    return results


def gpt_backward_definition(b, s, h, hd, d, form, dtype=DataType.Float):
    """A FusionDefinition of the GPT block backward on d ranks, from the forward's saved outputs."""
    _check_form(form)
    fd = FusionDefinition()
    with fd:
        define_gpt_backward(fd, b, s, h, hd, dtype, DeviceMesh(range(d)), form)
    return fd


def gpt_reference(p, h):
    """The GPT block forward in PyTorch on unsharded tensors (autograd-friendly)."""
    x = p["x"]
    b, s, e = x.shape
    hd = e // h
    ln0 = F.layer_norm(x, [e], p["ln0_w"], p["ln0_b"], EPS)
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, h, hd).transpose(1, 2) for n in "qkv")
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, e)
    res0 = x + F.linear(attn, p["wo"], p["bo"])
    ln1 = F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], EPS)
    return res0 + F.linear(F.gelu(F.linear(ln1, p["w1"], p["b1"])), p["w2"], p["b2"])


# ---- Llama-style block -----------------------------------------------------------------------------

def _llama_heads(h, kv_heads):
    return {"q": h, "k": h if kv_heads is None else kv_heads, "v": h if kv_heads is None else kv_heads}


def _rope_tables(fd, t):
    """cos and sin as [s, 1, hd]: they broadcast over the heads of [b, s, heads, hd] (a broadcast, not
    a reshape: it stays inside the generated kernels that read it)."""
    return (fd.ops.broadcast(t[n], [False, True, False]) for n in ("cos", "sin"))


def define_llama_forward(fd, b, s, h, hd, ffn, dtype=DataType.Float, mesh=None, form="tp", kv_heads=None,
                         save=False):
    """The Llama-style block forward in fd: inputs LLAMA_PARAMS (cos/sin: [s, hd] RoPE tables),
    output the block output, then with save=True LLAMA_SAVED. kv_heads: key/value heads
    (grouped-query attention), a divisor of h; on a mesh each rank takes whole groups."""
    e, heads = h * hd, _llama_heads(h, kv_heads)
    t = {n: fd.define_tensor(shape, dtype=dtype) for n, shape in llama_shapes(b, s, e, hd, ffn, kv_heads).items()}
    sp = mesh is not None and form == "sp"
    normed0 = _gather(fd, rms_norm(fd, t["x"], t["norm0_w"], e, dtype), mesh if sp else None)
    # RoPE runs in the projections' [b, s, heads, hd] layout: attention reads q, k and v in place.
    cos, sin = _rope_tables(fd, t)
    bshd = {n: fd.ops.reshape(fd.ops.linear(normed0, t[f"w{n}"]), [b, s, heads[n], hd]) for n in "qkv"}
    bshd["q"], bshd["k"] = (rotary(fd, bshd[n], cos, sin, hd) for n in "qk")
    attn, lse, seed, offset = fd.ops.sdpfa_fwd(*(fd.ops.permute(bshd[n], [0, 2, 1, 3]) for n in "qkv"),
                                               is_causal=True)
    attn_flat = merge_heads(fd, attn, b, s, e)
    proj = fd.ops.linear(attn_flat, t["wo"])
    res0 = fd.ops.add(t["x"], proj)
    normed1 = _gather(fd, rms_norm(fd, res0, t["norm1_w"], e, dtype), mesh if sp else None)
    gate, up = fd.ops.linear(normed1, t["w_gate"]), fd.ops.linear(normed1, t["w_up"])
    gated = fd.ops.mul(fd.ops.silu(gate), up)
    down = fd.ops.linear(gated, t["w_down"])
    fd.add_output(fd.ops.add(res0, down))
    if save:
        flat = [fd.ops.reshape(bshd[n], [b, s, heads[n] * hd]) for n in "qkv"]
        # gated is saved, not recomputed: the forward writes it anyway for w_down's GEMM, and the
        # backward's SwiGLU kernel then writes two [rows, ffn] tensors instead of three (measured
        # 0.518 ms against Inductor's 0.383 on H100 when it recomputed), for one more such tensor
        # alive between forward and backward, as torch.compile keeps.
        for tv in (normed0, *flat, attn_flat, lse, seed, offset, res0, normed1, gate, up, gated):
            fd.add_output(tv)
    if mesh is not None:
        _annotate(t, mesh, _split_axes(LLAMA_SPLIT, form))
        if sp:
            _split_on_mesh(proj, SEQUENCE_AXIS, mesh)
            _split_on_mesh(down, SEQUENCE_AXIS, mesh)
    return t


def llama_forward_definition(b, s, h, hd, ffn, d, form, dtype=DataType.Float, kv_heads=None, save=False):
    _check_form(form)
    fd = FusionDefinition()
    with fd:
        define_llama_forward(fd, b, s, h, hd, ffn, dtype, DeviceMesh(range(d)), form, kv_heads, save)
    return fd


def rms_norm_backward(fd, dy, x, w, e, dtype):
    """dx, dw of RMSNorm over the last axis (1/rms recomputed from x): with xhat = x / rms,
    dx = (dy * w - xhat * mean(dy * w * xhat)) / rms."""
    dy, x = _float(fd, dy, dtype), _float(fd, x, dtype)
    mean_square = fd.ops.div(fd.ops.sum(fd.ops.mul(x, x), [2], keepdim=True), float(e))
    rstd = fd.ops.rsqrt(fd.ops.add(mean_square, EPS))
    xhat = fd.ops.mul(x, rstd)
    dw = fd.ops.sum(fd.ops.mul(dy, xhat), [0, 1])
    dxhat = fd.ops.mul(dy, w)
    mean_dxhat_xhat = fd.ops.div(fd.ops.sum(fd.ops.mul(dxhat, xhat), [2], keepdim=True), float(e))
    dx = fd.ops.mul(rstd, fd.ops.sub(dxhat, fd.ops.mul(xhat, mean_dxhat_xhat)))
    return _back(fd, dx, dtype), _back(fd, dw, dtype)


def swiglu_backward(fd, dy, gate, up):
    """d_gate, d_up of silu(gate) * up (SiLU recomputed: pointwise), silu'(g) = sig(g) (1 + g (1 - sig(g)))."""
    sig = fd.ops.sigmoid(gate)
    d_up = fd.ops.mul(dy, fd.ops.mul(gate, sig))
    slope = fd.ops.mul(sig, fd.ops.add(fd.ops.sub(gate, fd.ops.mul(gate, sig)), 1.0))
    return fd.ops.mul(fd.ops.mul(dy, up), slope), d_up


# What the Llama backward differentiates: every input but the RoPE tables.
LLAMA_GRADS = [n for n in LLAMA_PARAMS if n not in ("cos", "sin")]


def define_llama_backward(fd, b, s, h, hd, ffn, dtype=DataType.Float, mesh=None, form="tp", kv_heads=None):
    """The Llama-style block backward in fd: inputs dy, LLAMA_SAVED, LLAMA_PARAMS; outputs one
    gradient per LLAMA_GRADS entry. Communications as define_gpt_backward's: the gate and up
    input-gradient partials are summed before one Allreduce (TP) or ReduceScatter (SP), and the q, k
    and v ones before another; SP also gathers the gradient before each row-parallel linear's
    backward and Allreduces the RMSNorm weight gradients."""
    e, rows, heads = h * hd, b * s, _llama_heads(h, kv_heads)
    kv = heads["k"] * hd
    saved_shapes = {"normed0": [b, s, e], "q": [b, s, e], "k": [b, s, kv], "v": [b, s, kv], "attn": [b, s, e],
                    "lse": [b, h, s], "res0": [b, s, e], "normed1": [b, s, e], "gate": [b, s, ffn],
                    "up": [b, s, ffn], "gated": [b, s, ffn]}
    dy = fd.define_tensor([b, s, e], dtype=dtype)
    t = {}
    for n in LLAMA_SAVED:
        if n in ("seed", "offset"):
            t[n] = fd.define_tensor([], dtype=DataType.Int)
        else:
            t[n] = fd.define_tensor(saved_shapes[n], dtype=DataType.Float if n == "lse" else dtype)
    p = {n: fd.define_tensor(shape, dtype=dtype) for n, shape in llama_shapes(b, s, e, hd, ffn, kv_heads).items()}
    sp = mesh is not None and form == "sp"
    gather = (lambda tv: _gather(fd, tv, mesh)) if sp else (lambda tv: tv)  # noqa: E731
    partial_outputs = []  # column-parallel input gradients: ReduceScatter (SP) or Allreduce (TP)
    d = {}

    # MLP: out = res0 + linear(silu(gate) * up, w_down), gate/up = linear(normed1, w_gate/w_up).
    dy_whole = gather(dy)
    d_gated, d["w_down"], _ = linear_backward(fd, dy_whole, t["gated"], p["w_down"], rows, bias=False)
    d_gate, d_up = swiglu_backward(fd, d_gated, t["gate"], t["up"])
    d_from_gate, d["w_gate"], _ = linear_backward(fd, d_gate, t["normed1"], p["w_gate"], rows, bias=False)
    d_from_up, d["w_up"], _ = linear_backward(fd, d_up, t["normed1"], p["w_up"], rows, bias=False)
    partial_outputs += [d_from_gate, d_from_up]
    d_res0, d["norm1_w"] = rms_norm_backward(fd, fd.ops.add(d_from_gate, d_from_up), t["res0"], p["norm1_w"], e,
                                             dtype)
    d_res0 = fd.ops.add(d_res0, dy)
    # Attention: res0 = x + linear(attn, wo); q and k rotated after their projections.
    d_attn, d["wo"], _ = linear_backward(fd, gather(d_res0), t["attn"], p["wo"], rows, bias=False)
    grads = fd.ops.sdpfa_bwd(split_heads(fd, d_attn, b, s, h, hd),
                             *(split_heads(fd, t[n], b, s, heads.get(n, h), hd) for n in ("q", "k", "v", "attn")),
                             t["lse"], 0.0, True, t["seed"], t["offset"])
    cos, sin = _rope_tables(fd, p)
    d_normed0 = None
    for n, grad in zip("qkv", grads):
        g = fd.ops.permute(grad, [0, 2, 1, 3])  # [b, s, heads, hd]: a view of the kernel's layout
        if n != "v":
            g = rotary_backward(fd, g, cos, sin, hd)
        d_in, d[f"w{n}"], _ = linear_backward(fd, fd.ops.reshape(g, [b, s, heads[n] * hd]), t["normed0"],
                                              p[f"w{n}"], rows, bias=False)
        partial_outputs.append(d_in)
        d_normed0 = d_in if d_normed0 is None else fd.ops.add(d_normed0, d_in)
    d_x, d["norm0_w"] = rms_norm_backward(fd, d_normed0, p["x"], p["norm0_w"], e, dtype)
    d["x"] = fd.ops.add(d_x, d_res0)
    for n in LLAMA_GRADS:
        fd.add_output(d[n])
    if mesh is not None:
        split = _split_axes(LLAMA_SPLIT, form)
        if sp:
            split.update(dy=SEQUENCE_AXIS, res0=SEQUENCE_AXIS)
        split.update(q=2, k=2, v=2, attn=2, lse=1, gate=2, up=2, gated=2)  # heads, and the MLP's hidden features
        _annotate({"dy": dy, **t, **p}, mesh, split)
        if sp:
            for tv in partial_outputs:
                _split_on_mesh(tv, SEQUENCE_AXIS, mesh)
    return d


def llama_backward_definition(b, s, h, hd, ffn, d, form, dtype=DataType.Float, kv_heads=None):
    """A FusionDefinition of the Llama-style block backward on d ranks, from the forward's saved
    outputs (llama_forward_definition(..., save=True))."""
    _check_form(form)
    fd = FusionDefinition()
    with fd:
        define_llama_backward(fd, b, s, h, hd, ffn, dtype, DeviceMesh(range(d)), form, kv_heads)
    return fd


def _rms_norm_reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rotate_half(t):
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def llama_reference(p, h):
    """The Llama-style block forward in PyTorch on unsharded tensors (autograd-friendly); the
    key/value heads are wk's rows over the head size."""
    x = p["x"]
    b, s, e = x.shape
    hd = e // h
    normed = _rms_norm_reference(x, p["norm0_w"])
    q, k, v = (F.linear(normed, p[f"w{n}"]).view(b, s, -1, hd).transpose(1, 2) for n in "qkv")
    q, k = (t * p["cos"] + _rotate_half(t) * p["sin"] for t in (q, k))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, s, e)
    res0 = x + F.linear(attn, p["wo"])
    normed1 = _rms_norm_reference(res0, p["norm1_w"])
    return res0 + F.linear(F.silu(F.linear(normed1, p["w_gate"])) * F.linear(normed1, p["w_up"]), p["w_down"])


def communications(profile):
    """The communication kinds a meshfuser.Profiler saw, in order."""
    from meshfuser.testing import communication_kinds
    return communication_kinds([k.name for k in profile.kernel_profiles if k.scheduler == "communication"])


def require_close(what, error, expected, torch_dtype, baseline=None):
    """Ends the example with an error when `error` (max |result - float32 reference|) is larger than
    the dtype allows: relative to the reference's magnitude, or, where given, 4x `baseline`, the error
    PyTorch itself makes at this dtype (a bfloat16 gradient that sums many cancelling terms, such
    as the key bias's, is noise-sized in both). The examples double as checks: scripts/test runs
    them on ranks sharing a GPU."""
    relative = 1e-3 if torch_dtype == torch.float32 else 5e-2  # bfloat16 keeps 8 bits of mantissa
    limit = relative * max(1.0, expected.abs().max().item())
    if baseline is not None:
        limit = max(limit, 4 * baseline)
    if not error <= limit:
        raise SystemExit(f"{what}: max |error| {error:.3e} exceeds {limit:.3e}")


def same_dtype_reference(reference_fn, full, h, device, grad_names, dy=None):
    """PyTorch on the unsharded tensors at their own dtype on `device`: its output and gradients
    (as float32 on the CPU), whose distance from the float32 reference is the baseline of
    require_close."""
    p = {n: t.to(device).requires_grad_(n in grad_names) for n, t in full.items()}
    out = reference_fn(p, h)
    if dy is not None:
        out.backward(dy.to(device))
    return out.detach().float().cpu(), {n: p[n].grad.float().cpu() for n in grad_names if p[n].grad is not None}


def baseline_error(same, want):
    """max |same - want|, or None without a same-dtype reference (float32 runs)."""
    return None if same is None else (same - want).abs().max().item()


def check_gradients(names, grads, reference, same_grads, split, mesh, rank, torch_dtype):
    """Checks this rank's gradient shards against float32 autograd (require_close, with PyTorch's
    own same-dtype gradients as the baseline); returns the largest error."""
    largest = 0.0
    for n, grad in zip(names, grads):
        want, same = reference[n].grad, same_grads.get(n)
        if n in split:
            want = mesh.shard_tensor(want, split[n], rank)
            same = None if same is None else mesh.shard_tensor(same, split[n], rank)
        error = (grad.float().cpu() - want).abs().max().item()
        require_close(f"rank {rank} gradient of {n}", error, want, torch_dtype, baseline_error(same, want))
        largest = max(largest, error)
    return largest
