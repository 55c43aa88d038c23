// Partial sums of GEMM outputs accumulated by the GEMMs themselves (host/gemm_accumulate.cpp).
#pragma once

#include "host/host_program.h"

namespace mf {

// Folds `s = add(partial, gemm(a, b))` into the GEMM's segment, marked gemm_accumulate, where the
// GEMM's output and the partial have no other reader: the runtime then computes partial += a @ b in
// the partial's buffer (cuBLAS beta = 1) instead of a GEMM output and a separate add kernel.
// Segments left empty are removed. MESHFUSER_DISABLE=gemm_accumulate turns it off.
void foldSumsIntoGemms(HostProgram& hp);

}  // namespace mf
