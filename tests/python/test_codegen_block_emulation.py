"""Normalization kernels with barriers and warp shuffles, run on the CPU (cuda_emulation.py's block
emulation: one OS thread per CUDA thread) against PyTorch: the norm backwards as the transformer
blocks write them on one GPU, statistics recomputed in the same kernel as the input gradient
(chained block reductions: mean, variance, then the gradient's two sums), and the weight/bias
gradients' column sums, which compute dy in float and xhat again from the bf16 inputs and the
row kernel's statistics (runtime/piece_recompute.h) instead of reading them back in float."""
import os
import re
import sys

import pytest
import torch

from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import cuda_emulation  # noqa: E402
import transformer_blocks as blocks  # noqa: E402

needs_gxx = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on this machine")
ROWS, COLS = 3, 4096  # wide rows: 256-thread blocks reducing through shared memory


def _kernel(source):
    name = re.search(r"(mf_\w+_[0-9a-f]{16})\(", source).group(1)
    bx, by = (int(v) for v in re.search(r"(\d+) x (\d+) threads per block", source).group(1, 2))
    return name, (bx, by)


def _signature(source):
    kernel = source[source.index('extern "C"'):]
    return kernel[:kernel.index(") {")]


def _run_segment(fd, inputs, values):
    """Runs every generated kernel of fd's one segment in order on the CPU: `values` maps tensor
    numbers to tensors (the fusion's inputs); each kernel's outputs are added to it."""
    for source in fd.cuda_kernels(inputs):
        name, block = _kernel(source)
        params = cuda_emulation.kernel_parameters(source)
        sig = _signature(source)
        # Row kernels write [ROWS, COLS] outputs; the others (column sums) [COLS].
        outer = "normalization: mf_count rows x" not in source
        for is_out, n in params:
            if is_out:
                ctype = re.search(rf"(\w+)\* __restrict__ T{n}\b", sig).group(1)
                dtype = {"float": torch.float32, "mf_bf16": torch.bfloat16}[ctype]
                values[n] = torch.zeros(COLS if outer else (ROWS, COLS), dtype=dtype)
        cuda_emulation.run_block_kernel(source, name, [values[n] for _, n in params], [o for o, _ in params], ROWS,
                                        block)
    return values


def _norm_backward(backward, seed):
    """The block's norm backward (examples/transformer_blocks.py) on [1, ROWS, COLS] bf16, its dx
    plus a residual, emulated kernel by kernel: (the fusion's outputs in order, the generated
    kernels, dy, x, w, the residual, all in float64 but the outputs)."""
    g = torch.Generator().manual_seed(seed)
    dy, x, res = (torch.randn(1, ROWS, COLS, generator=g).to(torch.bfloat16) for _ in range(3))
    w = (torch.randn(COLS, generator=g) * 0.5 + 1).to(torch.bfloat16)
    with FusionDefinition() as fd:
        t_dy, t_x = (fd.define_tensor([1, ROWS, COLS], dtype=DataType.BFloat16) for _ in range(2))
        t_w = fd.define_tensor([COLS], dtype=DataType.BFloat16)
        t_res = fd.define_tensor([1, ROWS, COLS], dtype=DataType.BFloat16)
        dx, *weights = backward(fd, t_dy, t_x, t_w, COLS, DataType.BFloat16)
        for out in [fd.ops.add(dx, t_res)] + weights:
            fd.add_output(out)
    inputs = [dy, x, w, res]
    kernels = fd.cuda_kernels(inputs)
    values = _run_segment(fd, inputs, dict(enumerate(inputs)))
    numbers = [int(t[1:]) for t in str(fd).strip().splitlines()[-2].split("outputs:")[1].split()]
    return [values[n] for n in numbers], kernels, *(t.double() for t in (dy[0], x[0], w, res[0]))


@needs_gxx
def test_layer_norm_backward_with_its_statistics_in_one_kernel():
    (dx, dw, db), kernels, dy, x, w, res = _norm_backward(blocks.layer_norm_backward, 0)
    assert len(kernels) == 2 and _kernel(kernels[0])[1][0] >= 128  # a block per row: shared-memory sums
    assert kernels[0].count("__syncthreads") >= 3  # mean, variance, then the gradient's sums
    # The column sums read dy and x in bf16 (and two per-row statistics), not float copies of them.
    assert len(re.findall(r"const mf_bf16\* __restrict__", _signature(kernels[1]))) == 2, _signature(kernels[1])
    assert len(re.findall(r"const float\* __restrict__", _signature(kernels[1]))) == 2
    rstd = 1 / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + 1e-5)
    xhat, g = (x - x.mean(1, keepdim=True)) * rstd, dy * w
    ref_dx = rstd * (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True))
    torch.testing.assert_close(dx.float(), (ref_dx + res).float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dw.float(), (dy * xhat).sum(0).float(), rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(db.float(), dy.sum(0).float(), rtol=2e-2, atol=5e-2)


@needs_gxx
def test_rms_norm_backward_with_its_statistics_in_one_kernel():
    (dx, dw), kernels, dy, x, w, res = _norm_backward(blocks.rms_norm_backward, 2)
    assert _kernel(kernels[0])[1][0] >= 128 and kernels[0].count("__syncthreads") >= 2
    rstd = 1 / torch.sqrt((x * x).mean(1, keepdim=True) + 1e-5)
    xhat, g = x * rstd, dy * w
    ref_dx = rstd * (g - xhat * (g * xhat).mean(1, keepdim=True))
    torch.testing.assert_close(dx.float(), (ref_dx + res).float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dw.float(), (dy * xhat).sum(0).float(), rtol=2e-2, atol=5e-2)


@needs_gxx
@pytest.mark.parametrize("grid_y", [1, 3])
def test_outer_reduction_split_over_row_chunks(grid_y):
    """A column sum over many rows, its rows split into chunks over grid_y (3: chunks of 688, 688
    and 672 rows): each block writes its chunk's partials to the workspace and the last block of a
    column tile combines them. A warp spans the 512 columns (two tiles of 256)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_outer_reduction_split import column_sum
    rows, cols = 2048, 512
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    (source,) = column_sum(DataType.BFloat16).cuda_kernels([x], arch="sm_90")
    name, block = _kernel(source)
    assert "mf_work" in source and block == (32, 16)
    out = torch.zeros(cols, dtype=torch.bfloat16)
    cuda_emulation.run_block_kernel(source, name, [x, out], [False, True], rows, block, grid=(2, grid_y))
    torch.testing.assert_close(out, (x.double().sum(0) * 0.5).to(torch.bfloat16), rtol=1e-2, atol=1e-2)


@needs_gxx
def test_rms_norm_then_rope_recomputes_the_normalized_rows():
    """RMSNorm over the head dimension, then RoPE (rotate_half's slices and cat): a reduction kernel
    stores the per-row statistic only, and the pointwise RoPE computes x * rstd again from x."""
    from test_codegen_resize import rotate_half
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, 8, 64])
        n = fd.ops.mul(t, fd.ops.rsqrt(fd.ops.add(fd.ops.sum(fd.ops.mul(t, t), [2], keepdim=True), 1e-6)))
        fd.add_output(fd.ops.add(n, rotate_half(fd, n, [2, 8, 64])))
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(5))
    reduction, pointwise = fd.cuda_kernels([x])
    name, block = _kernel(reduction)
    (_, x_number), (_, stat_number) = cuda_emulation.kernel_parameters(reduction)
    stat = torch.zeros(16)
    cuda_emulation.run_block_kernel(reduction, name, [x, stat], [False, True], 16, block)
    out = torch.zeros(2, 8, 64)
    cuda_emulation.run_pointwise(pointwise, {x_number: x, stat_number: stat.view(2, 8, 1),
                                             cuda_emulation.kernel_parameters(pointwise)[-1][1]: out})
    normed = x * torch.rsqrt((x * x).sum(2, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, normed + torch.cat([-normed[..., 32:], normed[..., :32]], -1))


@needs_gxx
@pytest.mark.parametrize("grid_y", [1, 3])
def test_several_column_reductions_share_one_outer_reduction_kernel(grid_y):
    """The GPT backward's LayerNorm weight and bias gradients beside another bias gradient: three
    column reductions of one [rows, cols] domain (one a max, to check each keeps its own combine)
    in one outer reduction kernel with 16-byte loads, split over row chunks (grid_y 3) with every
    reduction's partials in the workspace. They had been an outer normalization kernel of 2-byte
    loads and no row split (0.226 ms for 134 MB on an H200)."""
    rows, cols = 2048, 512
    g = torch.Generator().manual_seed(5)
    dy, x, other = (torch.randn(rows, cols, generator=g).to(torch.bfloat16) for _ in range(3))
    mean, rstd = torch.randn(rows, 1, generator=g), torch.rand(rows, 1, generator=g) + 0.5
    with FusionDefinition() as fd:
        t_dy, t_x, t_other = (fd.define_tensor([-1, -1], dtype=DataType.BFloat16) for _ in range(3))
        t_mean, t_rstd = (fd.define_tensor([-1, 1], dtype=DataType.Float) for _ in range(2))
        dyf = fd.ops.cast(t_dy, DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(t_x, DataType.Float), t_mean), t_rstd)
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.max(fd.ops.cast(t_other, DataType.Float), [0]), DataType.BFloat16))
    inputs = [dy, x, other, mean, rstd]
    (source,) = fd.cuda_kernels(inputs, arch="sm_90")
    assert "outer reduction" in source and "normalization" not in source, source[:3000]
    assert "mf_array<mf_bf16, 8>" in source  # 16-byte loads of dy, x and other
    name, block = _kernel(source)
    params = cuda_emulation.kernel_parameters(source)
    values = dict(enumerate(inputs))  # the fusion's inputs are T0..T4
    outs = {n: torch.zeros(cols, dtype=torch.bfloat16) for is_out, n in params if is_out}
    values.update(outs)
    cuda_emulation.run_block_kernel(source, name, [values[n] for _, n in params], [o for o, _ in params], rows,
                                    block, grid=(2, grid_y))
    dw, db, mx = outs.values()
    xhat_ref = (x.double() - mean.double()) * rstd.double()
    torch.testing.assert_close(dw.float(), (dy.double() * xhat_ref).sum(0).float(), rtol=2e-2, atol=0.3)
    torch.testing.assert_close(db.float(), dy.double().sum(0).float(), rtol=2e-2, atol=0.3)
    torch.testing.assert_close(mx, other.max(0).values)


@needs_gxx
def test_reduction_kernel_stores_side_outputs_of_its_domain():
    """GELU's backward with its bias-gradient column sum, and beside it gelu(pre) itself (the
    activation a weight gradient's GEMM reads): one outer reduction kernel whose prologue stores
    gelu(pre) once per element, instead of a normalization kernel (or a second kernel reading pre)."""
    rows, cols = 600, 256
    g = torch.Generator().manual_seed(6)
    dy, pre = (torch.randn(rows, cols, generator=g).to(torch.bfloat16) for _ in range(2))
    with FusionDefinition() as fd:
        t_dy, t_pre = (fd.define_tensor([-1, -1], dtype=DataType.BFloat16) for _ in range(2))
        d_pre = blocks.gelu_backward(fd, fd.ops.cast(t_dy, DataType.Float), fd.ops.cast(t_pre, DataType.Float))
        fd.add_output(fd.ops.cast(d_pre, DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.ops.sum(d_pre, [0]), DataType.BFloat16))
        fd.add_output(fd.ops.gelu(t_pre))
    (source,) = fd.cuda_kernels([dy, pre], arch="sm_90")
    assert "outer reduction" in source and "normalization" not in source, source[:2000]
    name, block = _kernel(source)
    params = cuda_emulation.kernel_parameters(source)
    values = {0: dy, 1: pre}
    outs = {}
    sig = _signature(source)
    for is_out, n in params:
        if is_out:
            shape = (cols,) if re.search(rf"T{n}\[row\]", source) else (rows, cols)
            outs[n] = values[n] = torch.zeros(shape, dtype=torch.bfloat16)
    assert len(outs) == 3, sig
    cuda_emulation.run_block_kernel(source, name, [values[n] for _, n in params], [o for o, _ in params], rows,
                                    block, grid=(2, 2))
    x = pre.double()
    ref_d = dy.double() * (0.5 * (1 + torch.erf(x / 2 ** 0.5)) + x * torch.exp(-x * x / 2) / (2 * torch.pi) ** 0.5)
    by_shape = {tuple(t.shape): t for t in outs.values() if t.dim() == 1}
    full = [t for t in outs.values() if t.dim() == 2]
    torch.testing.assert_close(by_shape[(cols,)].float(), ref_d.sum(0).float(), rtol=2e-2, atol=0.2)
    expected_full = [ref_d.to(torch.bfloat16), torch.nn.functional.gelu(pre.float()).to(torch.bfloat16)]
    for want in expected_full:  # the two stored [rows, cols] outputs, in either parameter order
        assert any(torch.allclose(t.float(), want.float(), rtol=2e-2, atol=2e-2) for t in full)
