import importlib.metadata

# An installed meshfuser registers meshfuser.testing through its pytest11 entry point; a source
# checkout (PYTHONPATH=python) registers it here.
_installed = any(ep.name == "meshfuser" for ep in importlib.metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["meshfuser.testing"]
