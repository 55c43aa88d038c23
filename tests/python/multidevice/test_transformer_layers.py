"""A GPT block in tensor-parallel form (Megatron): LayerNorm -> column-parallel q/k/v projections
-> heads -> causal attention with the heads split -> row-parallel output projection -> residual ->
LayerNorm -> column-parallel GELU MLP -> row-parallel projection -> residual. Activations are
replicated (TP) or split on the sequence (SP). Forward TP: two Allreduce; SP: an Allgather before
each column-parallel part and a ReduceScatter after each row-parallel linear.
Backward, as its own definition from saved activations: one Allreduce per column-parallel input
gradient. Every rank checks against unsharded PyTorch (autograd for the gradients)."""
import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
import transformer_blocks as blocks  # noqa: E402

EPS = 1e-5
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_gpt_block_forward(multidevice_test, form):
    """TP: activations replicated, two Allreduce. SP: activations split on the sequence, an
    Allgather before each column-parallel part (shared by q, k and v) and a ReduceScatter after
    each row-parallel linear."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    b, s, h, hd = 2, 2 * d, 2 * d, 4
    e = h * hd
    g = torch.Generator().manual_seed(0)
    shapes = {"x": [b, s, e], "ln0_w": [e], "ln0_b": [e], "wq": [e, e], "bq": [e], "wk": [e, e], "bk": [e],
              "wv": [e, e], "bv": [e], "wo": [e, e], "bo": [e], "ln1_w": [e], "ln1_b": [e], "w1": [4 * e, e],
              "b1": [4 * e], "w2": [e, 4 * e], "b2": [e]}
    params = {n: torch.randn(shape, generator=g) * (0.3 if n[0] == "w" else 1.0) for n, shape in shapes.items()}
    # Column-parallel weights and biases split their output features, row-parallel weights their
    # input features; in SP form the activations split their sequence; everything else is replicated.
    split_axis = {"wq": 0, "bq": 0, "wk": 0, "bk": 0, "wv": 0, "bv": 0, "w1": 0, "b1": 0, "wo": 1, "w2": 1}
    if form == "sp":
        split_axis["x"] = 1

    def shard(tv, axis):
        tv.set_device_mesh(mesh)
        tv.outer_split(axis, d)
        tv.axis(axis).parallelize(ParallelType.mesh_x)

    with FusionDefinition() as fd:
        t = {n: fd.define_tensor(shape) for n, shape in shapes.items()}
        ln0 = blocks.layer_norm(fd, t["x"], t["ln0_w"], t["ln0_b"], e)
        q, k, v = (blocks.split_heads(fd, fd.ops.linear(ln0, t[f"w{n}"], t[f"b{n}"]), b, s, h, hd) for n in "qkv")
        attn, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)
        attn = fd.ops.reshape(fd.ops.permute(attn, [0, 2, 1, 3]), [b, s, e])
        proj = fd.ops.linear(attn, t["wo"], t["bo"])
        res0 = fd.ops.add(t["x"], proj)
        ln1 = blocks.layer_norm(fd, res0, t["ln1_w"], t["ln1_b"], e)
        mlp = fd.ops.linear(fd.ops.gelu(fd.ops.linear(ln1, t["w1"], t["b1"])), t["w2"], t["b2"])
        fd.add_output(fd.ops.add(res0, mlp))
        for n, tv in t.items():
            tv.set_device_mesh(mesh)
            if n in split_axis:
                shard(tv, split_axis[n])
        if form == "sp":  # the row-parallel results come out split on the sequence
            shard(proj, 1)
            shard(mlp, 1)

    inputs = [multidevice_test.shard_tensor(params[n], split_axis[n], mesh) if n in split_axis
              else params[n].to(multidevice_test.device) for n in shapes]
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(inputs)
    comms = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    kinds = ["Allreduce"] * 2 if form == "tp" else ["Allgather", "ReduceScatter"] * 2
    assert communication_kinds(comms) == (kinds if d > 1 else []), comms
    expected = blocks.gpt_reference(params, h)
    if form == "sp":
        expected = mesh.shard_tensor(expected, 1, multidevice_test.rank)
    torch.testing.assert_close(out.cpu(), expected, **TOL)
    # Attention runs on this rank's heads, in a segment of its own, between the two projections.
    program = fd.host_program()
    # (On CUDA the segmentation section lists the piece too: only the schedule's lines count.)
    attention = [line for line in program.splitlines() if "sdpfa_fwd(" in line and not line.strip().startswith("piece")]
    assert len(attention) == 1 and attention[0].strip().startswith("run segment"), program
    posted = [line for line in program.splitlines() if line.strip().startswith("post ") and "NoOp" not in line]
    assert len(posted) == (len(kinds) if d > 1 else 0), program


# -- backward ------------------------------------------------------------------------------------

def test_gpt_block_backward_tensor_parallel(multidevice_test):
    """The backward as its own definition, from the forward's saved activations (PyTorch's, here).
    Column-parallel weights get their gradients locally; the gradient flowing into each
    column-parallel linear's input is a partial sum: one Allreduce for the MLP and one per q/k/v
    projection (a fused QKV weight would make that one, once slices exist)."""
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    b, s, h, hd = 2, 4, 2 * d, 4
    e = h * hd
    g = torch.Generator().manual_seed(1)
    shapes = {"x": [b, s, e], "ln0_w": [e], "ln0_b": [e], "wq": [e, e], "bq": [e], "wk": [e, e], "bk": [e],
              "wv": [e, e], "bv": [e], "wo": [e, e], "bo": [e], "ln1_w": [e], "ln1_b": [e], "w1": [4 * e, e],
              "b1": [4 * e], "w2": [e, 4 * e], "b2": [e]}
    params = {n: (torch.randn(shape, generator=g) * (0.3 if n[0] == "w" else 1.0)).requires_grad_()
              for n, shape in shapes.items()}
    dy = torch.randn(b, s, e, generator=g)
    # The forward, keeping what the backward reads.
    p = params
    ln0 = F.layer_norm(p["x"], [e], p["ln0_w"], p["ln0_b"], EPS)
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, h, hd).transpose(1, 2) for n in "qkv")
    attn_heads, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    attn = attn_heads.transpose(1, 2).reshape(b, s, e)
    res0 = p["x"] + F.linear(attn, p["wo"], p["bo"])
    ln1 = F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], EPS)
    pre = F.linear(ln1, p["w1"], p["b1"])
    out = res0 + F.linear(F.gelu(pre), p["w2"], p["b2"])
    out.backward(dy)
    zero = torch.zeros((), dtype=torch.int64)
    saved = {"dy": dy, "x": p["x"], "ln0_w": p["ln0_w"], "ln0": ln0, "q": q, "k": k, "v": v, "attn": attn_heads,
             "lse": lse, "seed": zero, "offset": zero, "res0": res0, "ln1_w": p["ln1_w"], "ln1": ln1, "pre": pre,
             "wq": p["wq"], "wk": p["wk"], "wv": p["wv"], "wo": p["wo"], "w1": p["w1"], "w2": p["w2"]}
    saved = {n: t.detach() for n, t in saved.items()}
    split_axis = {"q": 1, "k": 1, "v": 1, "attn": 1, "lse": 1, "pre": 2, "wq": 0, "wk": 0, "wv": 0, "w1": 0,
                  "wo": 1, "w2": 1}

    with FusionDefinition() as fd:
        t = {n: fd.define_tensor(list(a.shape), dtype=meshfuser.DataType.Int if a.dtype == torch.int64
                                 else meshfuser.DataType.Float) for n, a in saved.items()}
        rows = b * s
        # MLP: out = res0 + linear(gelu(pre), w2, b2), pre = linear(ln1, w1, b1).
        d_act, d_w2, d_b2 = blocks.linear_backward(fd, t["dy"], fd.ops.gelu(t["pre"]), t["w2"], rows)
        d_pre = blocks.gelu_backward(fd, d_act, t["pre"])
        d_ln1, d_w1, d_b1 = blocks.linear_backward(fd, d_pre, t["ln1"], t["w1"], rows)
        d_res0, d_ln1_w, d_ln1_b = blocks.layer_norm_backward(fd, d_ln1, t["res0"], t["ln1_w"], e, DataType.Float)
        d_res0 = fd.ops.add(d_res0, t["dy"])
        # Attention: res0 = x + linear(merge_heads(attn), wo, bo).
        attn_flat = fd.ops.reshape(fd.ops.permute(t["attn"], [0, 2, 1, 3]), [b, s, e])
        d_attn_flat, d_wo, d_bo = blocks.linear_backward(fd, d_res0, attn_flat, t["wo"], rows)
        d_attn = blocks.split_heads(fd, d_attn_flat, b, s, h, hd)
        grads = fd.ops.sdpfa_bwd(d_attn, t["q"], t["k"], t["v"], t["attn"], t["lse"], 0.0, True, t["seed"],
                                 t["offset"])
        d_ln0, d_proj = None, {}
        for n, grad in zip("qkv", grads):
            flat = fd.ops.reshape(fd.ops.permute(grad, [0, 2, 1, 3]), [b, s, e])
            d_in, d_proj[f"w{n}"], d_proj[f"b{n}"] = blocks.linear_backward(fd, flat, t["ln0"], t[f"w{n}"], rows)
            d_ln0 = d_in if d_ln0 is None else fd.ops.add(d_ln0, d_in)
        d_x, d_ln0_w, d_ln0_b = blocks.layer_norm_backward(fd, d_ln0, t["x"], t["ln0_w"], e, DataType.Float)
        d_x = fd.ops.add(d_x, d_res0)
        results = {"x": d_x, "ln0_w": d_ln0_w, "ln0_b": d_ln0_b, **d_proj, "wo": d_wo, "bo": d_bo,
                   "ln1_w": d_ln1_w, "ln1_b": d_ln1_b, "w1": d_w1, "b1": d_b1, "w2": d_w2, "b2": d_b2}
        for tv in results.values():
            fd.add_output(tv)
        for n, tv in t.items():
            tv.set_device_mesh(mesh)
            if n in split_axis:
                tv.outer_split(split_axis[n], d)
                tv.axis(split_axis[n]).parallelize(ParallelType.mesh_x)

    inputs = [multidevice_test.shard_tensor(a, split_axis[n], mesh) if n in split_axis
              else a.to(multidevice_test.device) for n, a in saved.items()]
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    comms = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    # The MLP's input gradient, and the q, k and v input gradients added as partial sums before one
    # Allreduce (sum_partials), as Megatron's backward does.
    assert communication_kinds(comms) == (["Allreduce"] * 2 if d > 1 else []), comms
    # Gradients of column-parallel weights and biases come out split like them, row-parallel
    # weights like them, the rest whole.
    grad_split = {"wq": 0, "bq": 0, "wk": 0, "bk": 0, "wv": 0, "bv": 0, "w1": 0, "b1": 0, "wo": 1, "w2": 1}
    for (n, _), actual in zip(results.items(), outputs):
        expected = params[n].grad
        if n in grad_split:
            expected = mesh.shard_tensor(expected, grad_split[n], multidevice_test.rank)
        torch.testing.assert_close(actual.cpu(), expected, **TOL, msg=lambda m: f"grad of {n}: {m}")
