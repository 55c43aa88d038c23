# Run after the Python module is linked (script mode):
#   cmake -DPYTHON=<python> -DMODULE=<path of _C> -DCOMPILER=<c++> -P MeshfuserImportCheck.cmake
# Imports the freshly built module in a separate Python process and uses it: builds a small fusion
# and prints it (std::string and std::ostream across the module boundary). A module that cannot do
# that (seen: a GCC whose libstdc++ differs from the one Python loads imports fine, then crashes in
# the first print) fails the build here, with the compiler to blame, instead of crashing the user.
set(script [=[
import sys, torch, importlib.util as u
spec = u.spec_from_file_location("meshfuser._C", sys.argv[1])
m = u.module_from_spec(spec)
spec.loader.exec_module(m)
f = m.Fusion()
x = f.define_tensor([-1, 4], m.DataType.Float)
f.add_output(m.ops.binary(m.OpType.mul, m.ops.unary(m.OpType.neg, x), f.define_scalar(m.DataType.Double, 2.5)))
text = str(f)
assert "neg" in text and "mul" in text, text
]=])
execute_process(COMMAND "${PYTHON}" -c "${script}" "${MODULE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "meshfuser: the module built by ${COMPILER} does not import or crashes when used (${rc}):\n${err}\n"
    "It must be compiled by the compiler whose libstdc++ Python loads (the system one next to "
    "libtorch). Build with MESHFUSER_CXX=/usr/bin/g++ (pip install or scripts/setup).")
endif()
