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
