"""meshfuser as a torch.compile backend.

    model = torch.compile(model, backend="meshfuser")   # or backend=meshfuser.dynamo.backend

Installed meshfuser registers the name through the `torch_dynamo_backends` entry point; importing
this module registers it too (for a source tree on PYTHONPATH). See backend.py for the pipeline.
"""
from .backend import backend
from .partition import Report, clear_reports, reports

__all__ = ["backend", "reports", "clear_reports", "Report"]


def _register():
    from torch._dynamo.backends import registry
    # Through the entry point, torch registers the name itself after importing us: registering here
    # too would be a duplicate.
    if "meshfuser" in registry._COMPILER_FNS or registry._BACKENDS.get("meshfuser") is not None:
        return
    registry.register_backend(backend, name="meshfuser")


_register()
