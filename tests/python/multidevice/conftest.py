import importlib.metadata
import os

# An installed meshfuser registers meshfuser.testing through its pytest11 entry point; a source
# checkout (PYTHONPATH=python) registers it here.
_installed = any(ep.name == "meshfuser" for ep in importlib.metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["meshfuser.testing"]


def pytest_configure(config):
    # Kept for the tests that carry it: float32 attention used to have no CUDA kernel; it now runs
    # PyTorch's memory-efficient (or meshfuser's math) kernel, so nothing is skipped.
    config.addinivalue_line("markers", "float32_attention: checks float32 attention numbers")


def pytest_collection_modifyitems(config, items):
    """Ranks sharing a GPU (MESHFUSER_CUDA_BACKEND=gloo with CUDA tensors): DTensor's redistributions
    go through PyTorch's functional collectives, which crash the process (SIGSEGV in
    AsyncCollectiveTensor, torch 2.11) on Gloo with CUDA tensors, so the DTensor tests are skipped in
    that mode only; they run on CPU ranks and with NCCL."""
    import pytest
    import torch

    shared_gpu = os.environ.get("MESHFUSER_CUDA_BACKEND") == "gloo" and torch.cuda.is_available() and \
        os.environ.get("MESHFUSER_TEST_DEVICE", "cuda") == "cuda"
    if not shared_gpu:
        return
    skip = pytest.mark.skip(reason="shared-GPU mode: PyTorch's functional collectives crash on Gloo with CUDA "
                            "tensors (DTensor); covered on CPU ranks and with NCCL")
    for item in items:
        if "dtensor" in item.nodeid.lower():
            item.add_marker(skip)
