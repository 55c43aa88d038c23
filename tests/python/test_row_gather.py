"""Row gathers as generated kernels (runtime/row_gather.cpp, codegen/gather_sum.cpp): index_add
along the rows without atomics, the gather-sum kernel run on the CPU by cuda_emulation.py with the
sort and offsets the runtime computes, against torch.index_add (the sums deterministic: ascending
src row, float, rounded once); index_select's row gather against torch.index_select; out-of-range
indices trap; the MESHFUSER_INDEX_ADD switch and its errors; on a GPU, both in a fusion against
PyTorch."""
import os
import re
import subprocess
import sys

import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
import cuda_emulation  # noqa: E402
from test_codegen_arch import _nvcc  # noqa: E402

from meshfuser import _C  # noqa: E402

DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}
needs_gxx = pytest.mark.skipif(not cuda_emulation.available(), reason="g++ is not on this machine")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def sorted_rows(index, rows):
    """What the runtime computes before the kernel: src rows by destination row, and where each
    destination row's run starts."""
    keys, order = torch.sort(index.to(torch.int64), stable=True)
    return order, torch.searchsorted(keys, torch.arange(rows + 1))


def emulate_index_add(x, index, src, alignment_bytes=16):
    rows, width = x.shape[0], x[0].numel()
    k = _C._gather_sum_kernel(DT[x.dtype], rows, width, alignment_bytes)
    order, offsets = sorted_rows(index, rows)
    out = torch.empty_like(x).contiguous()
    cuda_emulation.run_grid_stride(k["source"], k["name"], [x.contiguous(), src.contiguous(), order, offsets, out,
                                                            float(index.numel())],
                                   [False, False, False, False, True, False], k["count"])
    return out, k


def reference_in_order(x, index, src):
    """Each row: x's value plus its src rows in ascending src order, summed in float32, rounded once."""
    acc = x.float().clone()
    for i in range(index.numel()):
        acc[index[i]] += src[i].float()
    return acc.to(x.dtype)


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 72, 200])  # vector widths 8/4, 8 then 4 (72 % 16), 8 / 4 (200)
def test_gather_sum_matches_index_add(dtype, width):
    torch.manual_seed(1)
    rows, n = 9, 23
    # Uneven: row 2 gets many src rows, rows 5 and 8 get none, one row gets exactly one.
    index = torch.tensor([2] * 8 + [0, 1, 1, 3, 3, 3, 4, 6, 6, 7, 7, 7, 0, 2, 4], dtype=torch.int64)
    assert index.numel() == n and 5 not in index.tolist() and 8 not in index.tolist()
    x = torch.randn(rows, width).to(dtype)
    src = torch.randn(n, width).to(dtype)
    out, k = emulate_index_add(x, index, src)
    vec = int(re.search(r"vec (\d+)", k["choices"]).group(1))
    assert vec == {(torch.float32, 64): 4, (torch.float32, 72): 4, (torch.float32, 200): 4,
                   (torch.bfloat16, 64): 8, (torch.bfloat16, 72): 8, (torch.bfloat16, 200): 8}[(dtype, width)]
    # Exactly the in-order float sum (the kernel's order and rounding), and close to PyTorch's.
    torch.testing.assert_close(out, reference_in_order(x, index, src), rtol=0, atol=0)
    torch.testing.assert_close(out.float(), torch.index_add(x.double(), 0, index, src.double()).float(),
                               **({"rtol": 1e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}))
    assert torch.equal(out[5], x[5]) and torch.equal(out[8], x[8])  # rows that receive nothing are copies


@needs_gxx
def test_gather_sum_narrow_vectors_and_no_src_rows():
    torch.manual_seed(2)
    x = torch.randn(4, 66).to(torch.bfloat16)  # 66 % 4 != 0: two elements per vector
    index = torch.tensor([3, 0, 3], dtype=torch.int64)
    src = torch.randn(3, 66).to(torch.bfloat16)
    out, k = emulate_index_add(x, index, src)
    assert "vec 2" in k["choices"]
    torch.testing.assert_close(out, reference_in_order(x, index, src), rtol=0, atol=0)
    # A pointer aligned to 4 bytes only: one bf16 pair per load.
    _, k = emulate_index_add(x, index, src, alignment_bytes=4)
    assert "vec 2" in k["choices"]
    _, k = emulate_index_add(x, index, src, alignment_bytes=2)
    assert "vec 1" in k["choices"]
    # No src rows (an expert group that received no tokens): out is x.
    empty_out, _ = emulate_index_add(x, torch.zeros(0, dtype=torch.int64), torch.zeros(0, 66, dtype=torch.bfloat16))
    assert torch.equal(empty_out, x)


@needs_gxx
@pytest.mark.parametrize("bad", [-1, 4])
def test_gather_sum_traps_on_an_index_out_of_range(bad):
    x = torch.randn(4, 64)
    index = torch.tensor([0, bad, 2])
    with pytest.raises(RuntimeError, match="emulated kernel failed"):
        emulate_index_add(x, index, torch.randn(3, 64))


def test_gather_sum_kernel_text_depends_on_dtype_width_and_vector_only():
    a = _C._gather_sum_kernel(DataType.BFloat16, 100, 4096)
    b = _C._gather_sum_kernel(DataType.BFloat16, 8192, 4096)
    c = _C._gather_sum_kernel(DataType.BFloat16, 8192, 2048)
    assert a["name"] == b["name"] and a["source"] == b["source"]  # a new row count compiles nothing
    assert a["name"] != c["name"]
    assert b["count"] == 8192 * 4096 // 8 and b["block"] == 256
    assert b["grid"] == 8192 * 4096 // 8 // 256  # one (row, vector group) per thread
    assert re.fullmatch(r"mf_gather_sum_[0-9a-f]{16}", a["name"])
    assert "atomic" not in a["source"]


def emulate_index_select(src, index, alignment_bytes=16):
    width = src[0].numel()
    k = _C._gather_sum_kernel(DT[src.dtype], index.numel(), width, alignment_bytes, mode="select")
    out = torch.empty((index.numel(),) + tuple(src.shape[1:]), dtype=src.dtype)
    cuda_emulation.run_grid_stride(k["source"], k["name"], [src.contiguous(), index.to(torch.int64), out,
                                                            float(src.shape[0])],
                                   [False, False, True, False], k["count"])
    return out, k


@needs_gxx
@pytest.mark.parametrize("dtype,width,vec", [(torch.bfloat16, 128, 8), (torch.float32, 36, 4), (torch.bfloat16, 3, 1)])
def test_row_gather_matches_index_select(dtype, width, vec):
    torch.manual_seed(5)
    src = torch.randn(7, width).to(dtype)
    index = torch.tensor([6, 0, 0, 3, 6, 2, 1, 1, 5])  # repeats, any order, row 4 never read
    out, k = emulate_index_select(src, index)
    assert k["name"].startswith("mf_gather_rows_") and f"vec {vec}," in k["choices"]
    assert torch.equal(out, torch.index_select(src, 0, index))


@needs_gxx
@pytest.mark.parametrize("bad", [-1, 7])
def test_row_gather_traps_on_an_index_out_of_range(bad):
    with pytest.raises(RuntimeError, match="emulated kernel failed"):
        emulate_index_select(torch.randn(7, 64), torch.tensor([0, bad]))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_with_nvcc(arch, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on this machine: the row gathers were not compiled")
    sources = [_C._gather_sum_kernel(dt, 8192, width, align, arch=arch, mode=mode)["source"]
               for dt in (DataType.BFloat16, DataType.Half, DataType.Float) for mode in ("sum", "select")
               for width, align in ((4096, 16), (66, 4), (3, 2))]
    text = "\n".join(f"namespace k{i} {{\n{src}\n}}\n" for i, src in enumerate(sources))
    cu = tmp_path / "row_gathers.cu"
    cu.write_text(text)
    r = subprocess.run([nvcc, f"-arch={arch}", "-std=c++17", "-c", str(cu), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def _index_add_fusion(shape, n, dtype=torch.float32):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), dtype=DT[dtype])
        i = fd.define_tensor([n], dtype=DataType.Int)
        s = fd.define_tensor([n] + list(shape[1:]), dtype=DT[dtype])
        fd.add_output(fd.ops.index_add(x, 0, i, s))
    return fd


def test_switch_values_and_errors(monkeypatch):
    torch.manual_seed(3)
    x, index, src = torch.randn(6, 64), torch.tensor([5, 0, 5, 2]), torch.randn(4, 64)
    fd = _index_add_fusion(x.shape, 4)
    for value in ["aten", "auto", ""]:
        monkeypatch.setenv("MESHFUSER_INDEX_ADD", value)
        torch.testing.assert_close(fd.execute([x, index, src])[0], torch.index_add(x, 0, index, src))
    monkeypatch.setenv("MESHFUSER_INDEX_ADD", "sorted")
    with pytest.raises(meshfuser.Error, match=r"MESHFUSER_INDEX_ADD=sorted: index_add of x \[6, 64\] cannot take "
                                              r"the sorted path: x is not a CUDA tensor"):
        fd.execute([x, index, src])
    monkeypatch.setenv("MESHFUSER_INDEX_ADD", "atomics")
    with pytest.raises(meshfuser.Error, match="MESHFUSER_INDEX_ADD: unknown value 'atomics'; valid values are auto, "
                                              "aten, sorted"):
        fd.execute([x, index, src])


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_index_add_through_the_sorted_path(dtype, monkeypatch):
    torch.manual_seed(4)
    rows, n, width = 300, 1800, 256
    x = torch.randn(rows, width, device="cuda").to(dtype)
    index = torch.randint(0, rows - 20, (n,), device="cuda")  # the last 20 rows receive nothing
    src = torch.randn(n, width, device="cuda").to(dtype)
    fd = _index_add_fusion(x.shape, n, dtype)
    monkeypatch.setenv("MESHFUSER_INDEX_ADD", "sorted")  # an error if the sorted path refused the call
    out = fd.execute([x, index, src])[0]
    torch.testing.assert_close(out.cpu(), reference_in_order(x.cpu(), index.cpu(), src.cpu()), rtol=0, atol=0)
    again = fd.execute([x, index, src])[0]
    assert torch.equal(out, again)  # deterministic, unlike atomics
    # Rows narrower than 64 elements stay on ATen: forcing the sorted path is an error naming why.
    fd_narrow = _index_add_fusion([rows, 8], n, dtype)
    with pytest.raises(meshfuser.Error, match="its rows are narrower than 64 elements"):
        fd_narrow.execute([x[:, :8].contiguous(), index, src[:, :8].contiguous()])


@needs_cuda
def test_cuda_index_select_rows(monkeypatch):
    torch.manual_seed(6)
    src = torch.randn(500, 3, 96, device="cuda").to(torch.bfloat16)  # rows of 3 x 96
    index = torch.randint(0, 500, (2000,), device="cuda")
    with FusionDefinition() as fd:
        s = fd.define_tensor([500, 3, 96], dtype=DataType.BFloat16)
        i = fd.define_tensor([2000], dtype=DataType.Int)
        fd.add_output(fd.ops.index_select(s, 0, i))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fd.execute([src, index])[0]
        torch.cuda.synchronize()
    assert torch.equal(out, torch.index_select(src, 0, index))
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(k.startswith("mf_gather_rows_") for k in kernels), kernels
