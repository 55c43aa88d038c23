# meshfuser_check_libstdcxx(<C++ compiler> <Python executable>)
#
# The extension module runs inside a Python process whose libstdc++ is the one that process loads
# (the system one, next to libtorch). Code compiled by a GCC whose own libstdc++ is newer may call
# into library versions that do not exist there and crash at import (seen: a second GCC in
# /opt/gcc, selected by CXX, segfaulting inside std::ostream). This check compares, at configure
# time, the libstdc++ the compiler links (`-print-file-name=libstdc++.so.6`) with the one Python
# loads after `import torch`, and fails with the name of a compiler to use when the compiler's is
# newer (highest GLIBCXX_ version). -DMESHFUSER_CHECK_LIBSTDCXX=OFF skips it.
#
# Script mode, for tests: cmake -DCOMPILER=<c++> -DPYTHON=<python> -P MeshfuserCheckLibstdcxx.cmake

function(_meshfuser_glibcxx_max lib out_var)
  file(STRINGS "${lib}" versions REGEX "^GLIBCXX_[0-9]+\\.[0-9]+(\\.[0-9]+)?$")
  set(max 0)
  foreach(v IN LISTS versions)
    string(REPLACE "GLIBCXX_" "" n "${v}")
    if(n VERSION_GREATER max)
      set(max ${n})
    endif()
  endforeach()
  set(${out_var} ${max} PARENT_SCOPE)
endfunction()

# Absolute, resolved path of the libstdc++ `compiler` links, or "" (e.g. clang with libc++).
function(_meshfuser_compiler_libstdcxx compiler out_var)
  execute_process(COMMAND "${compiler}" -print-file-name=libstdc++.so.6
    OUTPUT_VARIABLE lib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT IS_ABSOLUTE "${lib}" OR NOT EXISTS "${lib}")
    set(${out_var} "" PARENT_SCOPE)
    return()
  endif()
  get_filename_component(lib "${lib}" REALPATH)
  set(${out_var} "${lib}" PARENT_SCOPE)
endfunction()

function(meshfuser_check_libstdcxx compiler python)
  _meshfuser_compiler_libstdcxx("${compiler}" compiler_lib)
  if(NOT compiler_lib)
    return()
  endif()
  execute_process(COMMAND "${python}" -c
    "import torch, os\nfor l in open('/proc/self/maps'):\n    p = l.split()[-1]\n    if 'libstdc++.so' in os.path.basename(p):\n        print(os.path.realpath(p)); break"
    OUTPUT_VARIABLE python_lib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT python_lib OR NOT EXISTS "${python_lib}")
    return()
  endif()
  if(compiler_lib STREQUAL python_lib)
    return()
  endif()
  _meshfuser_glibcxx_max("${compiler_lib}" compiler_max)
  _meshfuser_glibcxx_max("${python_lib}" python_max)
  if(NOT compiler_max VERSION_GREATER python_max)
    return()  # an older or equal libstdc++ is fine: the loaded one is backward compatible
  endif()
  # Suggest a compiler whose libstdc++ Python can run code of.
  set(suggestion "")
  foreach(candidate g++ c++ /usr/bin/g++ /usr/bin/c++ g++-14 g++-13 g++-12 g++-11)
    find_program(_mf_cand NAMES ${candidate} NO_CACHE)
    if(_mf_cand)
      _meshfuser_compiler_libstdcxx("${_mf_cand}" cand_lib)
      if(cand_lib)
        _meshfuser_glibcxx_max("${cand_lib}" cand_max)
        if(NOT cand_max VERSION_GREATER python_max)
          set(suggestion "${_mf_cand}")
          break()
        endif()
      endif()
    endif()
    unset(_mf_cand)
  endforeach()
  if(suggestion)
    set(advice "Build with that Python's compiler, e.g.\n  MESHFUSER_CXX=${suggestion} pip install --no-build-isolation .\n(pip install and ./scripts/setup pick the g++ on PATH by themselves; MESHFUSER_CXX overrides, or -DCMAKE_CXX_COMPILER=${suggestion})")
  else()
    set(advice "Build with a compiler whose libstdc++ is not newer than GLIBCXX_${python_max} (the GCC that built that Python's libstdc++), e.g. MESHFUSER_CXX=<that g++> pip install --no-build-isolation .")
  endif()
  message(FATAL_ERROR "meshfuser: the C++ compiler ${compiler} links libstdc++ ${compiler_lib} "
    "(up to GLIBCXX_${compiler_max}), but ${python} loads ${python_lib} (up to GLIBCXX_${python_max}) "
    "after importing torch. A module compiled by ${compiler} can crash at import against the older "
    "library. ${advice}. -DMESHFUSER_CHECK_LIBSTDCXX=OFF skips this check.")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  meshfuser_check_libstdcxx("${COMPILER}" "${PYTHON}")
  message(STATUS "meshfuser: ${COMPILER} is compatible with the libstdc++ of ${PYTHON}")
endif()
