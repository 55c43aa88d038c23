"""Generated kernels for other devices than the one they were tuned on: the device limits
(meshfuser.device_limits, the table of known architectures), what the schedulers derive from them,
the sm_90 kernel text kept as it was, and an nvcc compile of the whole kernel corpus for every
architecture PyTorch supports (sm_80 .. sm_120), each generated with its own limits (skipped with the
reason when nvcc is not on the machine)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

sys.path.insert(0, os.path.dirname(__file__))
import kernel_corpus  # noqa: E402
import norm_patterns  # noqa: E402

ARCHS = ["sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_120"]


def _nvcc():
    for candidate in (shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _nvcc_archs(nvcc):
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    return {"sm_" + line.strip().split("_")[1] for line in out.splitlines() if line.strip().startswith("compute_")}


def test_known_architectures_are_what_pytorch_supports():
    assert meshfuser.known_architectures() == ARCHS
    for arch in ARCHS:
        d = meshfuser.device_limits(arch)
        assert d.arch == arch and d.compute_capability == int(arch[3:])
        assert d.warp_size == 32 and d.max_threads_per_block == 1024 and d.registers_per_sm == 65536
        assert d.shared_mem_per_block == 48 * 1024 <= d.shared_mem_per_block_optin < d.shared_mem_per_sm
    # The resident-thread and shared-memory limits that differ between capabilities (CUDA C++
    # Programming Guide, "Technical Specifications per Compute Capability").
    assert [meshfuser.device_limits(a).max_threads_per_sm for a in ARCHS] == [2048, 1536, 2048, 1536, 2048, 2048, 1536]
    assert [meshfuser.device_limits(a).shared_mem_per_sm // 1024 for a in ARCHS] == [164, 100, 164, 100, 228, 228, 100]


def test_default_limits_are_the_sm90_table_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the defaults are its limits (test_current_device_limits)")
    assert meshfuser.device_limits() == meshfuser.device_limits("sm_90")
    assert meshfuser.device_limits().sm_count == 132


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_current_device_limits_are_queried():
    d = meshfuser.device_limits()
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert d.sm_count == p.multi_processor_count
    assert d.compute_capability == p.major * 10 + p.minor and d.arch == f"sm_{p.major}{p.minor}"
    assert d.max_threads_per_sm == p.max_threads_per_multi_processor
    assert d.shared_mem_per_block_optin == p.shared_memory_per_block_optin
    assert d.registers_per_sm == p.regs_per_multiprocessor and d.l2_bytes == p.L2_cache_size
    # The H200 these heuristics were tuned on generates exactly the sm_90 table's kernels.
    table = meshfuser.device_limits("sm_90")
    if d.arch == "sm_90" and d.sm_count == 132:
        assert kernel_corpus.corpus()[:40] == kernel_corpus.corpus(device_limits=table)[:40]


def test_device_limits_overrides_and_their_errors():
    d = meshfuser.device_limits("sm_80", sm_count=54)
    assert d.sm_count == 54 and d.arch == "sm_80" and d.max_threads_per_sm == 2048
    assert d.to_dict()["sm_count"] == 54 and "with overrides" in d.device_name
    with pytest.raises(meshfuser.Error, match=r"unknown GPU architecture 'sm_70'; known architectures: sm_80, sm_86"):
        meshfuser.device_limits("sm_70")
    with pytest.raises(meshfuser.Error, match=r"unknown field 'sms'; the fields are: compute_capability, sm_count"):
        meshfuser.device_limits("sm_90", sms=10)
    with pytest.raises(meshfuser.Error, match="sm_count must be positive, got 0"):
        meshfuser.device_limits("sm_90", sm_count=0)
    with pytest.raises(meshfuser.Error, match="warp_size must be 32"):
        meshfuser.device_limits("sm_90", warp_size=64)
    with pytest.raises(meshfuser.Error, match=r"shared_mem_per_block \(49152\) <= shared_mem_per_block_optin \(1024\)"):
        meshfuser.device_limits("sm_90", shared_mem_per_block_optin=1024)
    with pytest.raises(meshfuser.ArgumentError, match="sm_count must be an int"):
        meshfuser.device_limits("sm_90", sm_count="many")


def _softmax_fd():
    with FusionDefinition() as fd:
        norm_patterns.softmax(fd, DataType.Float, 64, 16384)
    return fd


def test_cuda_kernels_argument_errors():
    fd = _softmax_fd()
    x = [torch.empty(64, 16384, device="meta")]
    with pytest.raises(meshfuser.Error, match="unknown GPU architecture 'sm_75'"):
        fd.cuda_kernels(x, arch="sm_75")
    with pytest.raises(meshfuser.ArgumentError, match="give arch= or a DeviceLimits as device_limits=, not both"):
        fd.cuda_kernels(x, arch="sm_80", device_limits=meshfuser.device_limits("sm_80"))
    with pytest.raises(meshfuser.ArgumentError, match="device_limits must be a meshfuser.DeviceLimits or a dict"):
        fd.cuda_kernels(x, device_limits=[1, 2])
    with pytest.raises(meshfuser.Error, match="unknown field 'threads'"):
        fd.cuda_kernels(x, arch="sm_80", device_limits={"threads": 3})


def _launch(src):
    return re.search(r"__launch_bounds__\((\d+)(?:, (\d+))?\)", src).groups()


def test_staged_rows_follow_the_shared_memory_per_sm():
    # A float softmax row of 16384 is staged through 64 KiB of dynamic shared memory: two blocks fit
    # in 228 KiB (sm_90) or 164 KiB (sm_80), not in 100 KiB (sm_86, sm_89, sm_120), where the
    # staged bytes per block are at most (100 / 2 - 2) KiB = 48 KiB.
    fd = _softmax_fd()
    x = [torch.empty(64, 16384, device="meta")]
    for arch in ARCHS:
        d = meshfuser.device_limits(arch)
        (src,) = fd.cuda_kernels(x, arch=arch)
        staged = "mf_dyn" in src
        assert staged == (min(96 * 1024, d.shared_mem_per_sm // 2 - 2048) >= 64 * 1024), arch
        assert "mf_cp_async<16>" in src if staged else "mf_cp_async" not in src
    # 48 KiB still fits a bfloat16 row of 16384 (32 KiB) on sm_86.
    with FusionDefinition() as fd16:
        norm_patterns.softmax(fd16, DataType.BFloat16, 64, 16384)
    (src,) = fd16.cuda_kernels([torch.empty(64, 16384, device="meta", dtype=torch.bfloat16)], arch="sm_86")
    assert "mf_dyn" in src


def test_grids_follow_the_sm_count_and_resident_threads():
    # A large pointwise kernel: one wave of 256-thread blocks, sm_count x max_threads_per_sm / 256.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.relu(x))
    x = [torch.empty(16384, 16384, device="meta")]
    for arch in ARCHS:
        d = meshfuser.device_limits(arch)
        (src,) = fd.cuda_kernels(x, arch=arch)
        assert _launch(src)[0] == "256"
        # The grid is a launch argument, not in the text: the text is the same for every device
        # whose limits lead to the same choices; the heuristics dump shows the grid (below).
    sources = {fd.cuda_kernels(x, arch=a)[0] for a in ARCHS}
    assert len(sources) == 1
    # Few vector groups per SM take 128-thread blocks: the threshold is 128 groups per SM.
    small = [torch.empty(128 * 16 * 4, device="meta")]  # 128 x 16 groups of 4 floats
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.define_tensor([-1])))
    assert _launch(fd.cuda_kernels(small, device_limits={"sm_count": 16})[0])[0] == "128"
    assert _launch(fd.cuda_kernels(small, device_limits={"sm_count": 15})[0])[0] == "256"


def test_transpose_tiles_follow_the_shared_memory_per_sm():
    # Four resident transpose blocks per SM: the float tiles of a block get at most
    # min(48 KiB - 8 KiB, shared_mem_per_sm / 4 - 1 KiB): 40 KiB on sm_90, 24 KiB on sm_86. Three
    # float inputs transposed at vec 4 need 3 x 16 x 4 x 64 x 4 = 48 KiB: vec 2 (24 KiB) on both...
    with FusionDefinition() as fd:
        ins = [fd.define_tensor([-1, -1]) for _ in range(3)]
        t = [fd.ops.permute(i, [1, 0]) for i in ins]
        fd.add_output(fd.ops.add(fd.ops.add(t[0], t[1]), t[2]))
    x = [torch.empty(512, 1024, device="meta")] * 3
    tiles = {a: re.findall(r"__shared__ float mf_tile\d+\[(\d+)\]\[64\]", fd.cuda_kernels(x, arch=a)[0]) for a in ARCHS}
    assert tiles["sm_90"] == ["32"] * 3 and tiles["sm_86"] == ["32"] * 3
    # ... and two at vec 4 need 32 KiB: within sm_90's 40 KiB, past sm_86's 24 KiB (vec 2 there).
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), fd.ops.permute(b, [1, 0])))
    x = [torch.empty(512, 1024, device="meta")] * 2
    for arch in ARCHS:
        d = meshfuser.device_limits(arch)
        cap = min(40 * 1024, d.shared_mem_per_sm // 4 - 1024)
        (src,) = fd.cuda_kernels(x, arch=arch)
        (tile_b,) = set(re.findall(r"__shared__ float mf_tile\d+\[(\d+)\]\[64\]", src))
        assert int(tile_b) == (64 if 2 * 64 * 64 * 4 <= cap else 32), arch
        assert _launch(src) == ("256", "4")


def test_every_block_fits_the_device_block_limit():
    # No device since sm_20 limits blocks below 1024 threads, but the schedulers must not assume
    # it: with smaller limits every kernel's __launch_bounds__ (its block) stays within them.
    for max_threads in (256, 64):
        for label, src in kernel_corpus.corpus(arch="sm_90", device_limits={"max_threads_per_block": max_threads}):
            assert int(_launch(src)[0]) <= max_threads, (max_threads, label)


HEURISTICS_SCRIPT = r"""
import torch
from meshfuser import FusionDefinition
with FusionDefinition() as fd:
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.relu(x))
fd.cuda_kernels([torch.empty(16384, 16384, device="meta")], arch="sm_86")
"""


def test_heuristics_dump_prints_limits_params_and_choices():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    env["MESHFUSER_DUMP"] = "heuristics"
    r = subprocess.run([sys.executable, "-c", HEURISTICS_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "device: sm_86 [A40 (sm_86 table)]" in out and "sm_count 84" in out and "max_threads_per_sm 1536" in out
    assert "pointwise params: vector <= 16 bytes / 8 elements, block 128" in out
    # 16384^2 / 4 groups: 256-thread blocks, one wave of 84 SMs x 1536 / 256 blocks.
    assert "chosen: vec 4, unroll 4, index 32, block 256x1, grid 504," in out, out


def test_sm90_corpus_text_is_unchanged():
    """The kernels generated for the sm_90 limits (the H200 the heuristics were measured on) are
    exactly what they were before the heuristics came from the device. After an intended change
    of the generated text, rewrite the golden file (see kernel_corpus.py)."""
    with open(kernel_corpus.GOLDEN) as f:
        golden = json.load(f)
    names = kernel_corpus.kernel_names(kernel_corpus.corpus(arch="sm_90"))
    changed = sorted(label for label in golden.keys() | names.keys() if golden.get(label) != names.get(label))
    assert not changed, (f"{len(changed)} corpus entries changed their sm_90 text, e.g. {changed[:5]}; if intended, "
                         "run: PYTHONPATH=python python tests/python/kernel_corpus.py --write-golden")


@pytest.mark.timeout(1800)  # ~190 kernels per architecture, nvcc -c: 10-60 s each on a loaded machine
@pytest.mark.parametrize("arch,overrides", [(a, {}) for a in ARCHS] + [("sm_90", {"max_threads_per_block": 64})],
                         ids=ARCHS + ["sm_90_blocks_of_64"])
def test_corpus_compiles_with_nvcc(arch, overrides, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on this machine: the generated corpus was not compiled for " + arch)
    if arch not in _nvcc_archs(nvcc):
        pytest.skip(f"this nvcc cannot compile for {arch} (nvcc --list-gpu-arch)")
    sources = kernel_corpus.corpus(arch=arch, device_limits=overrides)
    assert len(sources) >= 150
    schedulers = {re.search(r"\bmf_([a-z]+)_[0-9a-f]{16}\(", src).group(1) for _, src in sources}
    assert schedulers == {"pointwise", "reduction", "normalization", "transpose"}
    # One translation unit: each kernel in its own namespace (extern "C" names are distinct hashes).
    text = "\n".join(f"namespace k{i} {{  // {label}\n{src}\n}}\n" for i, (label, src) in enumerate(sources))
    cu = tmp_path / f"corpus_{arch}.cu"
    cu.write_text(text)
    r = subprocess.run([nvcc, f"-arch={arch}", "-std=c++17", "-c", str(cu), "-o", str(tmp_path / "corpus.o")],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
