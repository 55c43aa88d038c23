// Running a gemm_accumulate segment (host/gemm_accumulate.cpp): partial += a @ b in place.
#pragma once

#include <ATen/ATen.h>

#include <unordered_map>
#include <vector>

#include "ir/fusion.h"

namespace mf {

// Runs `exprs` = {g = gemm(a, b), s = add(partial, g)} as one GEMM that adds into the partial's
// buffer (cuBLAS beta = 1) and binds s to it. False, with nothing changed, where that cannot be done
// safely (the buffer is shared or strided, a 3-D weight, a broadcast): the caller then evaluates
// the exprs one by one.
bool accumulateIntoPartial(const std::vector<Expr*>& exprs, std::unordered_map<const Val*, at::Tensor>& values);

}  // namespace mf
