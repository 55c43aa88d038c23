"""A GPT block forward in tensor-parallel form (Megatron): LayerNorm -> column-parallel q/k/v
projections -> heads -> causal attention with the heads split -> row-parallel output projection ->
residual -> LayerNorm -> column-parallel GELU MLP -> row-parallel projection -> residual.
Activations are replicated; the two row-parallel linears are the only communications (two
Allreduce). Every rank checks the block against unsharded PyTorch."""
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds

EPS = 1e-5
TOL = dict(rtol=1e-4, atol=1e-4)


def _layer_norm(fd, x, w, b, e):
    """LayerNorm over the last axis from sum, sub, mul and rsqrt."""
    mean = fd.ops.div(fd.ops.sum(x, [2], keepdim=True), float(e))
    centered = fd.ops.sub(x, mean)
    var = fd.ops.div(fd.ops.sum(fd.ops.mul(centered, centered), [2], keepdim=True), float(e))
    normed = fd.ops.mul(centered, fd.ops.rsqrt(fd.ops.add(var, EPS)))
    return fd.ops.add(fd.ops.mul(normed, w), b)


def _heads(fd, t, b, s, h, hd):
    """[b, s, h*hd] -> [b, h, s, hd]."""
    return fd.ops.permute(fd.ops.reshape(t, [b, s, h, hd]), [0, 2, 1, 3])


def _reference(p, b, s, h, hd):
    e = h * hd
    x = p["x"]
    ln0 = F.layer_norm(x, [e], p["ln0_w"], p["ln0_b"], EPS)
    q, k, v = (F.linear(ln0, p[f"w{n}"], p[f"b{n}"]).view(b, s, h, hd).transpose(1, 2) for n in "qkv")
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, e)
    res0 = x + F.linear(attn, p["wo"], p["bo"])
    ln1 = F.layer_norm(res0, [e], p["ln1_w"], p["ln1_b"], EPS)
    return res0 + F.linear(F.gelu(F.linear(ln1, p["w1"], p["b1"])), p["w2"], p["b2"])


def test_gpt_block_forward_tensor_parallel(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    b, s, h, hd = 2, 8, 2 * d, 4
    e = h * hd
    g = torch.Generator().manual_seed(0)
    shapes = {"x": [b, s, e], "ln0_w": [e], "ln0_b": [e], "wq": [e, e], "bq": [e], "wk": [e, e], "bk": [e],
              "wv": [e, e], "bv": [e], "wo": [e, e], "bo": [e], "ln1_w": [e], "ln1_b": [e], "w1": [4 * e, e],
              "b1": [4 * e], "w2": [e, 4 * e], "b2": [e]}
    params = {n: torch.randn(shape, generator=g) * (0.3 if n[0] == "w" else 1.0) for n, shape in shapes.items()}
    # Column-parallel weights and biases split their output features, row-parallel weights their
    # input features; everything else is replicated.
    split_axis = {"wq": 0, "bq": 0, "wk": 0, "bk": 0, "wv": 0, "bv": 0, "w1": 0, "b1": 0, "wo": 1, "w2": 1}

    with FusionDefinition() as fd:
        t = {n: fd.define_tensor(shape) for n, shape in shapes.items()}
        ln0 = _layer_norm(fd, t["x"], t["ln0_w"], t["ln0_b"], e)
        q, k, v = (_heads(fd, fd.ops.linear(ln0, t[f"w{n}"], t[f"b{n}"]), b, s, h, hd) for n in "qkv")
        attn, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)
        attn = fd.ops.reshape(fd.ops.permute(attn, [0, 2, 1, 3]), [b, s, e])
        res0 = fd.ops.add(t["x"], fd.ops.linear(attn, t["wo"], t["bo"]))
        ln1 = _layer_norm(fd, res0, t["ln1_w"], t["ln1_b"], e)
        mlp = fd.ops.linear(fd.ops.gelu(fd.ops.linear(ln1, t["w1"], t["b1"])), t["w2"], t["b2"])
        fd.add_output(fd.ops.add(res0, mlp))
        for n, tv in t.items():
            tv.set_device_mesh(mesh)
            if n in split_axis:
                tv.outer_split(split_axis[n], d)
                tv.axis(split_axis[n]).parallelize(ParallelType.mesh_x)

    inputs = [multidevice_test.shard_tensor(params[n], split_axis[n], mesh) if n in split_axis
              else params[n].to(multidevice_test.device) for n in shapes]
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(inputs)
    comms = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    assert communication_kinds(comms) == (["Allreduce"] * 2 if d > 1 else []), comms
    torch.testing.assert_close(out.cpu(), _reference(params, b, s, h, hd), **TOL)
    # Attention runs on this rank's heads, in a segment of its own, between the two projections.
    program = fd.host_program()
    attention = [line for line in program.splitlines() if "sdpfa_fwd(" in line]
    assert len(attention) == 1 and attention[0].strip().startswith("run segment"), program
    posted = [line for line in program.splitlines() if line.strip().startswith("post ") and "NoOp" not in line]
    assert len(posted) == (2 if d > 1 else 0), program
