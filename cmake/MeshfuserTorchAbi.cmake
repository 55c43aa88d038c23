# meshfuser_torch_abi(<out-var> <TORCH_CXX_FLAGS> <path of libc10>)
# The _GLIBCXX_USE_CXX11_ABI value libtorch was built with, without asking Python: from Torch's
# CMake flags when they carry it (older PyTorch), else from libc10's symbols (a C++11-ABI build
# exports std::__cxx11 names; recent PyTorch builds only that ABI and no longer says so in its flags).
function(meshfuser_torch_abi out_var torch_cxx_flags c10_library)
  if(torch_cxx_flags MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(abi ${CMAKE_MATCH_1})
  else()
    file(STRINGS "${c10_library}" hits REGEX "__cxx11" LIMIT_COUNT 1)
    if(hits)
      set(abi 1)
    else()
      set(abi 0)
    endif()
  endif()
  set(${out_var} ${abi} PARENT_SCOPE)
endfunction()
