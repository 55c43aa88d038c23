"""Outer (column) reductions with many reduced rows: the rows split into chunks over grid_y, each
block writing float partials to a workspace, the last block of a column tile combining them in
chunk order. CPU: the kernel text and the scheduler's choices (fd.cuda_kernels at the GPT block's
shapes, MESHFUSER_DUMP=heuristics). GPU (skipped without CUDA): results against PyTorch."""
import os
import re
import subprocess
import sys

import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

DTYPES = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def column_sum(dt, dims=(0,), op="sum", ndim=2):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * ndim, dtype=dt)
        r = getattr(fd.ops, op)(fd.ops.cast(x, DataType.Float), list(dims))
        fd.add_output(fd.ops.cast(fd.ops.mul(r, 0.5), dt))
    return fd


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("rows,cols", [(8192, 16384), (8192, 4096)])
def test_many_rows_split_over_blocks(rows, cols):
    (src,) = column_sum(DataType.BFloat16).cuda_kernels([meta(rows, cols)], arch="sm_90")
    assert "unsigned char* __restrict__ mf_work" in src  # the workspace parameter
    assert "atomicAdd(mf_arrived, 1u)" in src and "blockIdx.y * mf_chunk" in src
    assert "__ldcg(&mf_parts[" in src  # the combine reads the partials past L1


@pytest.mark.parametrize("rows,cols", [(300, 4096), (512, 16384), (1000, 16384)])
def test_few_rows_share_the_source(rows, cols):
    """The chunked path only runs with grid_y > 1, so few rows take the same text (one compile)."""
    fd = column_sum(DataType.BFloat16)
    assert fd.cuda_kernels([meta(rows, cols)], arch="sm_90") == fd.cuda_kernels([meta(8192, cols)], arch="sm_90")


DUMP_SCRIPT = """
import torch
from meshfuser import DataType, FusionDefinition
with FusionDefinition() as fd:
    x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
    fd.add_output(fd.ops.sum(fd.ops.cast(x, DataType.Float), [0]))
for rows, cols in [(8192, 16384), (8192, 4096), (300, 4096)]:
    fd.cuda_kernels([torch.empty(rows, cols, dtype=torch.bfloat16, device="meta")], arch="sm_90")
"""


def test_chunks_fill_one_wave_of_resident_blocks():
    """A warp across 32 vectors of columns, and the reduced rows split into chunks until the grid
    is one wave of resident blocks (rounded down, no partial wave), at least 32 rows a chunk."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "heuristics"
    r = subprocess.run([sys.executable, "-c", DUMP_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    chosen = re.findall(r"chosen: vec (\d+), .*?block (\d+)x(\d+), grid (\d+),[^\n]*", r.stdout)
    assert len(chosen) == 3, r.stdout
    d = meshfuser.device_limits("sm_90")
    for (vec, bx, by, grid), (rows, cols), line in zip(chosen, [(8192, 16384), (8192, 4096), (300, 4096)],
                                                       re.findall(r"chosen: [^\n]*", r.stdout)):
        vec, bx, by, grid = int(vec), int(bx), int(by), int(grid)
        assert (vec, bx) == (8, 32), line  # 512 contiguous bytes of a row per warp
        tiles = -(-cols // (vec * bx))
        split = re.search(r"reduced rows split in (\d+) chunks \(grid_y\), workspace (\d+) bytes", line)
        assert split, line
        chunks, workspace = int(split.group(1)), int(split.group(2))
        assert grid == tiles  # one block per (tile, chunk)
        resident = d.sm_count * (d.max_threads_per_sm // (bx * by))
        assert rows // chunks >= 32
        assert tiles * chunks <= resident, line
        assert tiles * (chunks + 1) > resident or chunks == rows // 32, line
        assert workspace == chunks * cols * 4 + tiles * 4  # float partials, then one counter per tile


def reference(x, dims, op):
    f = x.float()
    r = f.sum(dims) if op == "sum" else getattr(torch, "amax" if op == "max" else "amin")(f, dims)
    return (r * 0.5).to(x.dtype)


@cuda
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,dims,op", [
    ((8192 + 37, 4096), (0,), "sum"),    # rows not a multiple of the chunk
    ((1, 16384), (0,), "sum"),           # one row
    ((1024, 65536 + 8), (0,), "sum"),    # many columns, two chunks
    ((4099, 1000), (0,), "sum"),         # few column tiles, many chunks
    ((8192, 4096), (0,), "max"),
    ((5000, 777), (0,), "min"),          # odd columns: scalar accesses
    ((4, 4096, 96), (1,), "sum"),        # middle axes: [kept, reduced, kept]
    ((3, 3000, 520), (0, 1), "sum"),     # several reduced axes
])
def test_outer_reductions_match_pytorch(dtype, shape, dims, op):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, device="cuda")
    fd = column_sum(DTYPES[dtype], dims, op, len(shape))
    with meshfuser.Profiler() as prof:
        out = fd.execute([x])[0]
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["reduction"]
    expect = reference(x, dims, op)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expect.float(), rtol=tol, atol=tol * (shape[0] ** 0.5))
    # Again (the arrival counters start from zero every launch), then fewer rows with the same text.
    torch.testing.assert_close(fd.execute([x])[0], out, rtol=0, atol=0)
    if op == "sum" and shape[0] > 2048:
        y = x[: shape[0] // 3].contiguous()
        torch.testing.assert_close(fd.execute([y])[0].float(), reference(y, dims, op).float(), rtol=tol,
                                   atol=tol * (shape[0] ** 0.5))


@cuda
def test_split_sum_is_deterministic():
    torch.manual_seed(0)
    x = torch.randn(8192, 16384, dtype=torch.bfloat16, device="cuda")
    fd = column_sum(DataType.BFloat16)
    first = fd.execute([x])[0]
    for _ in range(3):
        assert torch.equal(fd.execute([x])[0], first)


@cuda
@pytest.mark.parametrize("rows,cols", [(8192, 4096), (3000, 520), (100, 4096)])
def test_several_column_reductions_in_one_kernel_match_pytorch(rows, cols):
    """A LayerNorm backward's weight and bias gradients with another column max beside them: one
    reduction kernel (every reduction's chunk partials in the workspace), against PyTorch, twice
    (the arrival counters start from zero every launch)."""
    torch.manual_seed(1)
    dy, x, other = (torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    mean, rstd = torch.randn(rows, 1, device="cuda"), torch.rand(rows, 1, device="cuda") + 0.5
    with FusionDefinition() as fd:
        t_dy, t_x, t_other = (fd.define_tensor([-1, -1], dtype=DataType.BFloat16) for _ in range(3))
        t_mean, t_rstd = (fd.define_tensor([-1, 1], dtype=DataType.Float) for _ in range(2))
        dyf = fd.ops.cast(t_dy, DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(t_x, DataType.Float), t_mean), t_rstd)
        fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xhat), [0]))
        fd.add_output(fd.ops.cast(fd.ops.sum(dyf, [0]), DataType.BFloat16))
        fd.add_output(fd.ops.max(fd.ops.cast(t_other, DataType.Float), [0]))
    inputs = [dy, x, other, mean, rstd]
    with meshfuser.Profiler() as prof:
        dw, db, mx = fd.execute(inputs)
    assert [k.scheduler for k in prof.profile.kernel_profiles] == ["reduction"]
    xhat_ref = (x.double() - mean.double()) * rstd.double()
    tol = 2e-2 * rows ** 0.5
    torch.testing.assert_close(dw.double(), (dy.double() * xhat_ref).sum(0), rtol=1e-3, atol=1e-3 * rows ** 0.5)
    torch.testing.assert_close(db.float(), dy.double().sum(0).float(), rtol=2e-2, atol=tol)
    torch.testing.assert_close(mx, other.float().max(0).values)
    again = fd.execute(inputs)
    for a, b in zip(again, (dw, db, mx)):
        assert torch.equal(a, b)
