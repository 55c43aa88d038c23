// Per-op checks (OpInfo::check): what an op requires of its operands, outputs and attributes
// together, beyond what each attribute's declaration says alone. Fusion::newExpr runs the check of
// every expr it creates (so builders, the parser and fd.op all go through it) and verifyFusion
// runs it again, after parsing and after every pass. Failures are user errors naming the expr.
#pragma once

namespace mf {

class Expr;

void checkCast(const Expr* e);
void checkReduction(const Expr* e);
void checkBroadcastInDim(const Expr* e);
void checkSqueeze(const Expr* e);
void checkPermute(const Expr* e);
void checkReshape(const Expr* e);
void checkSlice(const Expr* e);
void checkPad(const Expr* e);
void checkCat(const Expr* e);
void checkStrideOrder(const Expr* e);
void checkUniform(const Expr* e);
void checkEmbedding(const Expr* e);
void checkAttention(const Expr* e);
// Routing ops along an axis (sort, topk, gather, scatter, cumsum...): `dim` within the input's
// rank, topk's k within its extent, cumsum's output of its `dtype`.
void checkAlongDim(const Expr* e);
void checkBincount(const Expr* e);

// Runs the declaration checks (attributes complete, typed, valid) and the op's check on `e`.
void checkExpr(const Expr* e);

}  // namespace mf
