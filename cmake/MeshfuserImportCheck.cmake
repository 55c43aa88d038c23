# Run after the Python module is linked (script mode):
#   cmake -DPYTHON=<python> -DMODULE=<path of _C> -DCOMPILER=<c++> -P MeshfuserImportCheck.cmake
# Imports the freshly built module in a separate Python process. A module that cannot be imported
# (a crash inside the C++ runtime it was built against, a missing symbol) fails the build here, with
# the compiler to blame, instead of crashing the user's first `import meshfuser`.
execute_process(
  COMMAND "${PYTHON}" -c "import torch, importlib.util as u; s = u.spec_from_file_location('meshfuser._C', r'${MODULE}'); u.module_from_spec(s)"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "meshfuser: the module built by ${COMPILER} does not import (${rc}):\n${err}\n"
    "It must be compiled by the compiler whose libstdc++ Python loads (the system one next to "
    "libtorch). Build with CXX=/usr/bin/g++ (pip install) or MESHFUSER_CXX=/usr/bin/g++ (scripts/setup).")
endif()
