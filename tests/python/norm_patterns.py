"""Normalization fusions written with meshfuser ops (float compute, inputs and outputs in `dtype`),
and the inputs they take. Shared by the codegen tests and benchmarks/normalization.py.

Each builder takes (fd, dtype, rows, cols) inside a FusionDefinition and defines inputs and
outputs; `make_inputs(name, dtype, rows, cols, transposed)` builds matching torch tensors."""
import torch

from meshfuser import DataType, FusionDefinition

F = DataType.Float
EPS = 1e-5


def _x(fd, dt):
    return fd.ops.cast(fd.define_tensor([-1, -1], dtype=dt), F)


def _row(fd, t, cols):
    """[rows] -> [rows, cols] (broadcast back along the row)."""
    return fd.ops.broadcast_in_dim(t, [-1, cols], [0])


def softmax(fd, dt, rows, cols):
    x = _x(fd, dt)
    m = fd.ops.max(x, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(x, m))
    s = fd.ops.sum(e, [1], keepdim=True)
    fd.add_output(fd.ops.cast(fd.ops.div(e, s), dt))


def log_softmax(fd, dt, rows, cols):
    x = _x(fd, dt)
    m = fd.ops.max(x, [1], keepdim=True)
    d = fd.ops.sub(x, m)
    s = fd.ops.sum(fd.ops.exp(d), [1], keepdim=True)
    fd.add_output(fd.ops.cast(fd.ops.sub(d, fd.ops.log(s)), dt))


def rms_norm(fd, dt, rows, cols):
    x = _x(fd, dt)
    w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    ms = fd.ops.div(fd.ops.sum(fd.ops.mul(x, x), [1]), float(cols))
    rstd = fd.ops.rsqrt(fd.ops.add(ms, EPS))
    fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(x, _row(fd, rstd, cols)), w), dt))
    fd.add_output(rstd)


def layer_norm(fd, dt, rows, cols):
    x = _x(fd, dt)
    w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    b = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    mean = fd.ops.div(fd.ops.sum(x, [1]), float(cols))
    d = fd.ops.sub(x, _row(fd, mean, cols))
    var = fd.ops.div(fd.ops.sum(fd.ops.mul(d, d), [1]), float(cols))
    rstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
    y = fd.ops.add(fd.ops.mul(fd.ops.mul(d, _row(fd, rstd, cols)), w), b)
    fd.add_output(fd.ops.cast(y, dt))
    fd.add_output(mean)
    fd.add_output(rstd)


def rms_norm_backward(fd, dt, rows, cols):
    """dx of y = x * rstd * w: rstd * (g*w - x*rstd * mean(g*w * x*rstd))."""
    g = _x(fd, dt)
    x = _x(fd, dt)
    rstd = _row(fd, fd.define_tensor([-1], dtype=F), cols)
    w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    gw = fd.ops.mul(g, w)
    xhat = fd.ops.mul(x, rstd)
    c = fd.ops.div(fd.ops.sum(fd.ops.mul(gw, xhat), [1]), float(cols))
    dx = fd.ops.mul(rstd, fd.ops.sub(gw, fd.ops.mul(xhat, _row(fd, c, cols))))
    fd.add_output(fd.ops.cast(dx, dt))


def layer_norm_backward(fd, dt, rows, cols):
    """dx of y = (x - mean) * rstd * w + b: rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat))."""
    g = _x(fd, dt)
    x = _x(fd, dt)
    mean = _row(fd, fd.define_tensor([-1], dtype=F), cols)
    rstd = _row(fd, fd.define_tensor([-1], dtype=F), cols)
    w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    gw = fd.ops.mul(g, w)
    xhat = fd.ops.mul(fd.ops.sub(x, mean), rstd)
    c1 = fd.ops.div(fd.ops.sum(gw, [1]), float(cols))
    c2 = fd.ops.div(fd.ops.sum(fd.ops.mul(gw, xhat), [1]), float(cols))
    inner = fd.ops.sub(fd.ops.sub(gw, _row(fd, c1, cols)), fd.ops.mul(xhat, _row(fd, c2, cols)))
    fd.add_output(fd.ops.cast(fd.ops.mul(rstd, inner), dt))


def transposed_add(fd, dt, rows, cols):
    """x.t() + y with x given as [cols, rows]."""
    x = fd.define_tensor([-1, -1], dtype=dt)
    y = fd.define_tensor([-1, -1], dtype=dt)
    fd.add_output(fd.ops.add(fd.ops.permute(x, [1, 0]), y))


PATTERNS = {"softmax": softmax, "log_softmax": log_softmax, "rms_norm": rms_norm, "layer_norm": layer_norm,
            "rms_norm_backward": rms_norm_backward, "layer_norm_backward": layer_norm_backward}


def _matrix(rows, cols, dtype, transposed, device):
    if transposed:  # same values, column-major storage
        return torch.randn(cols, rows, device=device).to(dtype).t()
    return torch.randn(rows, cols, device=device).to(dtype)


def make_inputs(name, dtype, rows, cols, transposed=False, device="cpu"):
    m = lambda: _matrix(rows, cols, dtype, transposed, device)
    vec = lambda: (torch.rand(cols, device=device) + 0.5).to(dtype)
    if name in ("softmax", "log_softmax"):
        return [m()]
    if name == "rms_norm":
        return [m(), vec()]
    if name == "layer_norm":
        return [m(), vec(), vec()]
    if name == "rms_norm_backward":
        return [m(), m(), torch.rand(rows, device=device) + 0.5, vec()]
    if name == "layer_norm_backward":
        return [m(), m(), torch.randn(rows, device=device) * 0.1, torch.rand(rows, device=device) + 0.5, vec()]
    if name == "transposed_add":
        return [_matrix(cols, rows, dtype, False, device), m()]
    if name == "batch_norm":
        return [m(), vec(), vec()]
    if name == "softmax_dim0":
        return [m()]
    raise KeyError(name)


def torch_reference(name, inputs, dtype):
    """The same formula in PyTorch eager (float compute), for benchmarks."""
    f = [t.float() for t in inputs]
    if name == "softmax":
        return [torch.softmax(f[0], -1).to(dtype)]
    if name == "log_softmax":
        return [torch.log_softmax(f[0], -1).to(dtype)]
    if name == "rms_norm":
        rstd = torch.rsqrt(f[0].pow(2).mean(-1) + EPS)
        return [(f[0] * rstd[:, None] * f[1]).to(dtype), rstd]
    if name == "layer_norm":
        mean = f[0].mean(-1)
        d = f[0] - mean[:, None]
        rstd = torch.rsqrt((d * d).mean(-1) + EPS)
        return [(d * rstd[:, None] * f[1] + f[2]).to(dtype), mean, rstd]
    if name == "rms_norm_backward":
        g, x, rstd, w = f
        gw, xhat = g * w, x * rstd[:, None]
        return [(rstd[:, None] * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))).to(dtype)]
    if name == "layer_norm_backward":
        g, x, mean, rstd, w = f
        gw, xhat = g * w, (x - mean[:, None]) * rstd[:, None]
        return [(rstd[:, None] * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))).to(dtype)]
    if name == "transposed_add":
        return [inputs[0].t() + inputs[1]]
    if name == "batch_norm":
        mean = f[0].mean(0)
        d = f[0] - mean
        rstd = torch.rsqrt((d * d).mean(0) + EPS)
        return [(d * rstd * f[1] + f[2]).to(dtype), mean, rstd]
    if name == "softmax_dim0":
        return [torch.softmax(f[0], 0).to(dtype)]
    raise KeyError(name)


def batch_norm(fd, dt, rows, cols):
    """Statistics over the rows (the outer axis) of [rows, cols], per column: (x - mean) * rstd * w + b."""
    x = _x(fd, dt)
    w = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    b = fd.ops.cast(fd.define_tensor([-1], dtype=dt), F)
    col = lambda t: fd.ops.broadcast_in_dim(t, [rows, -1], [1])  # noqa: E731
    mean = fd.ops.div(fd.ops.sum(x, [0]), float(rows))
    d = fd.ops.sub(x, col(mean))
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.div(fd.ops.sum(fd.ops.mul(d, d), [0]), float(rows)), EPS))
    fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(fd.ops.mul(d, col(rstd)), w), b), dt))
    fd.add_output(mean)
    fd.add_output(rstd)


def softmax_dim0(fd, dt, rows, cols):
    x = _x(fd, dt)
    m = fd.ops.max(x, [0], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(x, m))
    fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [0], keepdim=True)), dt))


OUTER_PATTERNS = {"batch_norm": batch_norm, "softmax_dim0": softmax_dim0}


def mixed_precision_fusions():
    """(label, fd, inputs): float tensors beside double or integer ones, so the kernel computes in
    double while float tensors keep float storage; wide enough to take vector accesses."""
    out = []
    with FusionDefinition() as fd:  # pointwise: float x, double w, float output (a cast back)
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        w = fd.define_tensor([-1], dtype=DataType.Double)
        y = fd.ops.mul(fd.ops.exp(x), w)
        fd.add_output(y)
        fd.add_output(fd.ops.cast(y, DataType.Float))
    out.append(("pointwise_float_double", fd, [torch.randn(64, 256), torch.randn(256, dtype=torch.float64)]))
    with FusionDefinition() as fd:  # normalization: a float row, a double weight, a float output
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        w = fd.define_tensor([-1], dtype=DataType.Double)
        s = fd.ops.sum(fd.ops.mul(x, x), [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(x, fd.ops.rsqrt(fd.ops.add(s, 1.0))), w), DataType.Float))
    out.append(("rms_float_double", fd, [torch.randn(64, 4096), torch.randn(4096, dtype=torch.float64)]))
    with FusionDefinition() as fd:  # softmax-like (staged rows) beside an int32 bias
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1], dtype=DataType.Int32)
        t = fd.ops.add(x, b)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), DataType.Float))
    out.append(("softmax_float_int32", fd, [torch.randn(64, 4096), torch.randint(-3, 3, (4096,), dtype=torch.int32)]))
    with FusionDefinition() as fd:  # a transposed float operand beside a double one
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        w = fd.define_tensor([-1, -1], dtype=DataType.Double)
        fd.add_output(fd.ops.add(fd.ops.permute(x, [1, 0]), w))
    out.append(("transposed_float_double", fd, [torch.randn(256, 128), torch.randn(128, 256, dtype=torch.float64)]))
    with FusionDefinition() as fd:  # a constant a float literal would round (float(1e18) is 1e18 - 1.6e10)
        x = fd.define_tensor([-1, -1], dtype=DataType.Double)
        fd.add_output(fd.ops.add(x, 1e18))
    out.append(("double_plus_1e18", fd, [torch.randn(64, 256, dtype=torch.float64)]))
    return out
