"""meshfuser: one program with global shapes and a few sharding annotations, run on 1..N devices."""
import os as _os

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed  # noqa: F401  (registers c10d types the extension returns)

from ._torch_check import import_extension as _import_extension

_C = _import_extension()
from . import _logging  # noqa: E402
from ._C import DataType, ParallelType, Error, ArgumentError, InternalError, __version__
from .mesh import DeviceMesh
from .distributed import Communicator
from .fusion_definition import FusionDefinition, TensorView, shard_tensor
from .profiler import Profiler, PythonProfiler
from .visualize import visualize_sharding
from . import dtensor  # noqa: F401  (meshfuser.dtensor after `import meshfuser`)
from ._C import set_cache_limits, compile_counters, DeviceLimits, device_limits, known_architectures

_logging.install()

# The folder to put on CMAKE_PREFIX_PATH for find_package(meshfuser) (C++ API: headers,
# libmeshfuser and the CMake package ship inside the installed package, as PyTorch's do).
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "share", "cmake")



def __getattr__(name):
    """meshfuser.dynamo (the torch.compile backend) is imported on first use: it imports torch._dynamo,
    which takes a second or more, and most programs never need it."""
    if name == "dynamo":
        import importlib
        return importlib.import_module(".dynamo", __name__)
    raise AttributeError(f"module 'meshfuser' has no attribute {name!r}")


__all__ = [
    "DataType", "ParallelType", "DeviceMesh", "FusionDefinition", "TensorView", "Communicator",
    "Error", "ArgumentError", "InternalError", "Profiler", "PythonProfiler", "shard_tensor", "__version__",
    "cmake_prefix_path", "set_cache_limits", "compile_counters", "visualize_sharding", "DeviceLimits",
    "device_limits", "known_architectures",
]
