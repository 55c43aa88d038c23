// Internal data shared by the CUDA generator's files (not part of the kernel.h contract).
//
// Requires: a KernelSegment whose exprs are in topological order, and one KernelTensorArg per tensor
// input of the segment. Guarantees: every helper either fills its result or returns false with a
// human-readable reason in *why (the runtime prints it under MESHFUSER_DUMP=fallback).
//
// Pipeline (one file per step):
//   analysis.cpp   dtype / op support checks and local-shape propagation (Analysis)
//   region.cpp     iteration domains: which domain axis every tensor axis walks (Region), and the
//                  collapsed index plan of the tensors loaded in a region (IndexPlan)
//   scheduler.cpp  pointwise vs reduction, inner vs outer, vector width and launch config (Schedule)
//   normalization.cpp  the persistent normalization plan (NormPlan): stages, loops, launch
//   emit_common.cpp / emit_pointwise.cpp / emit_reduction.cpp / emit_normalization.cpp /
//   emit_transpose.cpp   CUDA text
//   generate.cpp   generateKernel: the steps above, then naming by hash
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "codegen/heuristics.h"
#include "codegen/kernel.h"

namespace mf {
namespace codegen {

struct Analysis {
  const KernelSegment* segment = nullptr;
  std::vector<const TensorView*> tensor_inputs;  // segment input order
  std::vector<const Scalar*> scalar_inputs;      // segment input order (non-constant scalars)
  std::unordered_map<const TensorView*, std::vector<int64_t>> shape;  // local sizes of every tensor
  std::unordered_map<const TensorView*, const KernelTensorArg*> arg;  // segment input tensors only
  std::unordered_map<const TensorView*, const Expr*> producer;        // tensors defined in the segment
  std::vector<const Expr*> reductions;                               // every sum/max/min, in order
  const Expr* reduction = nullptr;                                    // the reduction when there is exactly one
  bool compute_double = false;  // a double or integer tensor: the kernel computes in double
};

// Checks dtypes and ops, binds args, propagates local shapes.
bool analyzeSegment(const KernelSegment& segment, const std::vector<KernelTensorArg>& args, Analysis* a,
                    std::string* why);

// Resize contexts (slice, pad, cat; codegen/resize.cpp). Upstream of a resize op a tensor is read
// at other coordinates than the domain's: a context gives, per domain axis, the coordinate
// `step * c + offset` (c: the domain coordinate) and the extent of the tensors computed in it.
// Context 0 is the domain itself (step 1, offset 0, the domain extent). A tensor read through
// both halves of rotate_half (slice, cat) is computed in three contexts: as is and shifted each way.
struct AxisWalk {
  int64_t step = 1, offset = 0, extent = 1;
  bool operator==(const AxisWalk& o) const { return step == o.step && offset == o.offset && extent == o.extent; }
};
using Context = std::vector<AxisWalk>;  // per domain axis
// lo <= step * c[axis] + offset < hi, over the domain coordinate c of `axis` (a bound that always
// holds over the domain is dropped: lo = INT64_MIN or hi = INT64_MAX).
struct Guard {
  int axis = 0;
  int64_t step = 1, offset = 0, lo = 0, hi = 0;
};
// How a resize op's output in one context takes its value: `input` in `context` where every guard
// holds (the first such branch wins; past the last one, the op's fill value).
struct ResizeBranch {
  const TensorView* input = nullptr;
  int context = 0;
  std::vector<Guard> guards;
};

// An iteration domain: the non-1 extents of its anchor tensors, in order. For every tensor read or
// written in the region, axis_map gives, per runtime axis of the tensor, the domain axis it walks
// (-1: the axis has local extent 1 and is not walked).
struct Region {
  std::vector<int64_t> extents;
  std::vector<const Expr*> exprs;                          // computed in the region, topological order
  std::unordered_map<const TensorView*, std::vector<int>> axis_map;
  std::vector<const TensorView*> loads;                    // segment inputs read, first-use order
  std::vector<const TensorView*> stores;                   // segment outputs written, production order
  // Resize ops (empty without): contexts[0] is the domain; value_contexts, per tensor computed or
  // loaded in another context than 0 only or as well, its contexts (ascending); branches, per resize
  // expr and context of its output, where that output's value comes from.
  std::vector<Context> contexts;
  std::unordered_map<const TensorView*, std::vector<int>> value_contexts;
  std::map<std::pair<const Expr*, int>, std::vector<ResizeBranch>> branches;
  bool hasResize() const { return !branches.empty(); }
  std::vector<int> contextsOf(const TensorView* tv) const {
    auto it = value_contexts.find(tv);
    return it == value_contexts.end() ? std::vector<int>{0} : it->second;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t e : extents) n *= e;
    return n;
  }
};

// Builds a region over `exprs` (topological order). `anchors` are tensors whose non-1 extents must
// equal `extents` in order (they walk the domain contiguously: outputs and the reduction's input or
// output). `stop` tensors are computed elsewhere (e.g. the reduction output in the epilogue): they
// are read as locals, never loaded. `forbidden` tensors may not be read at all (why names them).
// Per rootOrLogical axis of tv: its index among the non-reduction axes, or -1 for a reduction.
std::vector<int64_t> nonReductionPositions(const TensorView* tv);

// The tensor whose shape an anchor walks: a reshape's input for a reshape output (reshapes keep the
// row-major order, so the output is stored at the flat index of its input's domain), else itself.
const TensorView* domainTensor(const Analysis& a, const TensorView* tv);

bool buildRegion(const Analysis& a, const std::vector<const Expr*>& exprs, const std::vector<int64_t>& extents,
                 const std::vector<const TensorView*>& anchors, const std::vector<const TensorView*>& stop,
                 const std::vector<const TensorView*>& forbidden, Region* r, std::string* why);

// The map of input `in` of `e` (which domain axis each runtime axis of `in` walks) given the map of
// e's output, through the op's axis map; axes of local extent 1 walk none (-1).
std::vector<int> inputMap(const Analysis& a, const Expr* e, const TensorView* in, const std::vector<int>& out_map);

// How loaded tensors are indexed from a flat domain index: the domain with adjacent axes merged
// where every loaded tensor allows it, and each loaded tensor's stride per merged axis (0 on axes
// it broadcasts). `linear`: the tensor is contiguous over the whole domain (offset = flat index).
struct IndexPlan {
  std::vector<int64_t> dims;
  std::vector<int> group;  // per domain axis: its merged axis (an axis a resize shifts stays alone)
  std::unordered_map<const TensorView*, std::vector<int64_t>> strides;
  std::unordered_map<const TensorView*, bool> linear;
  int64_t max_offset = 0;  // largest element offset any loaded tensor reaches
};
IndexPlan planIndexing(const Analysis& a, const Region& r);

// ---- resize ops (resize.cpp) ----
// The name of tv's value in `context` ("t3" in context 0, "t3_c2").
std::string valueName(const TensorView* tv, int context);
// The map of resize expr e's tensor input `in` (which domain axis each of its axes walks): the
// axes are those of the output, position for position; an axis of extent 1 walks none. False
// (with why) where the input would be read at a fixed coordinate of a longer axis.
bool resizeInputMap(const Analysis& a, const Expr* e, const TensorView* in, const std::vector<int>& out_map,
                    std::vector<int>* m, std::string* why);
// Resize expr `e` whose output is needed in `context`: its branches (added to r->branches) and the
// (input, context) pairs they read, appended to *needs. Contexts are added to r->contexts.
bool addResizeBranches(const Analysis& a, const Expr* e, const std::vector<int>& out_map, int context, Region* r,
                       std::vector<std::pair<const TensorView*, int>>* needs, std::string* why);
// The guards under which tv, loaded in `context`, is in bounds (empty: always).
std::vector<Guard> loadGuards(const Region& r, const TensorView* tv, int context);
// Domain axes that some context walks differently from the domain (they stay unmerged).
std::vector<bool> resizedAxes(const Region& r);
// Whether vectors of `vec` elements along the innermost domain axis stay inside one branch of
// every resize and read contiguous, aligned elements in every context.
bool resizeAllowsVector(const Region& r, int64_t vec);
// `c` (a domain coordinate's text) walked as `w`.
std::string walkedCoord(const AxisWalk& w, const std::string& c);
// "lo <= x && x < hi" for the guards over the domain coordinates axis_coord (texts), or "".
std::string guardText(const std::vector<Guard>& guards, const std::vector<std::string>& axis_coord);
// "const float tN_cK = <select>;" for resize expr e's output in `context`.
std::string emitResize(const Region& r, const Expr* e, int context, const std::vector<std::string>& axis_coord,
                       const std::string& indent);

enum class Kind { Pointwise, InnerReduction, OuterReduction, Normalization, Transpose };

// A persistent (row-at-a-time) normalization: reductions over the innermost axes whose results are
// combined again with values of the row (softmax, RMSNorm, LayerNorm and their backward). The
// domain is the reduction input's non-1 extents, [kept..., reduced...]; a row is one kept index.
// A tensor `varies` when it changes along the reduced axes (one value per element of the row);
// otherwise it holds one value per row. Its `stage` is how many block-wide combines it waits for;
// the kernel runs loops 0..last_loop over the row, loop s accumulating the reductions whose input
// has stage s and computing the varying tensors whose `home` is s.
struct NormPlan {
  std::vector<int64_t> kept, reduced;                                // domain extents
  std::unordered_map<const TensorView*, std::vector<int>> axis_map;  // runtime axis -> domain axis
  std::unordered_map<const TensorView*, bool> varies;
  std::unordered_map<const TensorView*, int> stage;
  std::unordered_map<const TensorView*, int> home;  // varying tensors: the first loop that needs it
  std::vector<const TensorView*> loads;             // segment inputs read, segment input order
  std::vector<const TensorView*> row_outputs;       // outputs with one value per row
  int last_loop = 0;
  // Per loop, the varying tensors it computes (recomputed from the loads where an earlier loop had
  // them too: cheaper than keeping float copies live) and the varying loads it reads.
  std::vector<std::unordered_set<const TensorView*>> loop_values;
  // Persistent plans: transcendental varying values that later loops need again, kept as floats
  // from their home loop (mf_e arrays) instead of recomputed.
  std::unordered_set<const TensorView*> cached;
  // Persistent block rows: the loop-0 loads of the block's next row are copied into shared memory
  // by cp.async (mf_s arrays) while this row computes, costing no registers; each thread copies and
  // later reads back only its own vectors, so a cp.async.wait_group is the only synchronisation.
  std::unordered_set<const TensorView*> staged;
  // Row-dependent varying loads read again after their first loop: persistent plans keep their
  // raw vectors in registers; multi-pass plans, and loads the same for every row (weights), read
  // them again from memory.
  std::unordered_set<const TensorView*> reread;
  bool persistent = true;
  int64_t iters = 1;   // persistent: vector groups per thread per row
  bool outer = false;  // the reduced axes are outermost: a thread per kept element, multi-pass
  Region row_region, col_region;  // the kept / reduced halves of the domain, for offsets
  IndexPlan row_index, col_index;
};

// The one extent-dependent number of a kernel's text, passed at launch (Schedule::count): the loop
// bound that grows with the outermost extents (pointwise: vector groups; inner reduction and
// normalization: rows; outer reduction and outer normalization: reduced rows; transpose: tiles).
// Every other number in the text depends on inner extents, strides, dtypes and the scheduler's
// choices only, so one compiled kernel serves every row count that makes the same choices.
constexpr const char* kCountParam = "mf_n";
constexpr const char* kCount = "mf_count";

struct Schedule {
  Kind kind = Kind::Pointwise;
  int64_t count = 0;  // the value of kCount for these extents
  Region main;      // pointwise: the whole segment; reduction: the prologue over the reduction input
  Region epilogue;  // reduction only: the ops after it, over the reduction output
  IndexPlan main_index, epilogue_index;
  int64_t vec = 1;     // elements per vector access of the main region (1: scalar accesses)
  int64_t unroll = 1;  // vector groups per thread per main-loop step, all loaded before any math
  bool index64 = false;
  // Reductions: rows x reduced extent. Inner: X viewed as [rows, red]; outer: as [red, rows].
  int64_t rows = 1, red = 1;
  // Outer reductions over middle axes, X = [outer kept, red, inner kept]: the inner kept extent
  // (== rows for a plain outer reduction); column c of rows is (c / inner_kept, c % inner_kept).
  int64_t inner_kept = 1;
  // Outer reductions: the text can split the reduced rows into launch.grid_y chunks (run when
  // grid_y > 1); each block writes its chunk's float partials to the workspace and the last block
  // of a column tile combines them.
  bool split_rows = false;
  KernelLaunch launch;
  // Reduction kernels: the reductions folded (one, or several outer ones over the same domain).
  std::vector<const Expr*> reductions;
  NormPlan norm;  // Normalization only
  // The parameters of the scheduler that made this schedule (the one of `kind`), derived from the
  // device limits; the emitters read their numbers from here.
  PointwiseParams pointwise;
  ReductionParams reduction;
  NormalizationParams normalization;
  TransposeParams transpose;
  // Transpose: the merged domain axis (of main_index.dims) along which the transposed loads are
  // contiguous; tiles of transpose.tile_a x transpose.lanes_b * vec over (that axis, the innermost
  // axis) go through shared memory.
  int64_t transpose_axis = -1;
  std::vector<const TensorView*> transposed;  // loads read through the tile
  int64_t vec_a = 1;  // transpose: 2 when every transposed load reads two A-adjacent elements as one vector
};

bool chooseSchedule(const Analysis& a, const CodegenOptions& options, Schedule* s, std::string* why);
// The parameters of s's scheduler and the choices it made, as MESHFUSER_DUMP=heuristics prints them.
std::string heuristicsText(const Schedule& s, const DeviceLimits& device);

// ---- text helpers (emit_common.cpp) ----
// While alive, the kernel being emitted computes in double (literals print as doubles, casts to
// float round explicitly); toDoubleCompute then rewrites its float text, doubleHelpers() follows
// the prelude.
class DoubleComputeScope {
 public:
  explicit DoubleComputeScope(bool on);
  ~DoubleComputeScope();
  DoubleComputeScope(const DoubleComputeScope&) = delete;
  DoubleComputeScope& operator=(const DoubleComputeScope&) = delete;

 private:
  bool previous_;
};
std::string toDoubleCompute(const std::string& body);
std::string doubleHelpers();
std::string cudaType(DataType dt);                    // storage type in the kernel
std::string tensorLocal(const TensorView* tv);        // "t3"
std::string tensorParam(const TensorView* tv);        // "T3"
std::string operandText(const Val* v);                // "t3", "s2" or a float literal
std::string loadExpr(DataType dt, const std::string& element);  // element -> float
std::string storeExpr(DataType dt, const std::string& value);   // float -> storage
// The store of tv's local (a cast to the storage type stores its input: one conversion).
std::string storeOf(const TensorView* tv);
std::string storeSource(const TensorView* tv);  // the float local storeOf converts
// Vector stores of `vec` elements per thread from a `for k < vec` loop: emitStoreArrays declares
// the per-output staging (half/bfloat16 at an even width: floats converted two per instruction
// after the loop), storeLane is the statement for lane k, emitVectorStore writes one vector at dst.
void emitStoreArrays(const std::vector<const TensorView*>& tvs, int64_t vec, const std::string& indent,
                     std::ostringstream& os);
std::string storeLane(const TensorView* tv, int64_t vec);
void emitVectorStore(const TensorView* tv, int64_t vec, const std::string& dst, const std::string& indent,
                     std::ostringstream& os);
std::string floatLiteral(double v);
// "float t5 = <expr>;" lines for `e` (one per tensor output); `suffix` names the context its
// tensor operands and output are computed in (valueName).
std::string emitExpr(const Expr* e, const std::string& indent, const std::string& suffix = "");
// Substitutes operands for {0}, {1}, {2} in a registry expression.
std::string fillTemplate(const char* pattern, const std::vector<std::string>& operands);
std::string prelude();
// mf_cp_async<bytes>(shared, global), mf_cp_async_commit(), mf_cp_async_wait(): asynchronous
// global -> shared copies of 4, 8 or 16 bytes (a plain copy before sm_80).
std::string cpAsyncHelpers();
// A reduction's or op's int32 result wrapped as PyTorch's int32 arithmetic wraps (double compute
// only; other dtypes: `value` as is).
std::string wrapInt32Result(DataType dt, const std::string& value);
// Kernel signature: inputs, outputs, scalar doubles, the count (kCountParam, as long long), the
// workspace (kWorkspaceParam, when `workspace`); then the scalar locals and the count as `itype` (kCount).
constexpr const char* kWorkspaceParam = "mf_work";
std::string signature(const Analysis& a, const std::string& name_token, const std::string& itype, int64_t max_threads,
                      int64_t min_blocks = 0, bool workspace = false);
std::string indexType(bool index64);
// Emits the decomposition of `flat` over plan.dims (only when some loaded tensor is not linear) and
// returns each loaded tensor's offset expression.
// The same for every context a load is read in, and the coordinate text of every domain axis a
// resize shifts (axis_coord; "" elsewhere), for the guards.
struct RegionIndexText {
  std::vector<std::string> axis_coord;
  std::map<std::pair<const TensorView*, int>, std::string> offset;
};
RegionIndexText emitRegionIndex(const Region& r, const IndexPlan& p, const std::string& flat, const std::string& prefix,
                                const std::string& itype, const std::string& indent, std::ostringstream& os);
std::unordered_map<const TensorView*, std::string> emitOffsets(const Region& r, const IndexPlan& p,
                                                               const std::string& flat, const std::string& prefix,
                                                               const std::string& itype, const std::string& indent,
                                                               std::ostringstream& os);

// One group of `vec` consecutive elements of a region at flat index `flat` (a multiple of vec).
// Loads: with slot "" the values are declared here (vectors as vN, scalars straight into tN); with
// a slot like "[u]" they are assigned into the arrays that emitGroupArrays declared (vN[], xN[]).
void emitGroupArrays(const Region& r, const IndexPlan& p, int64_t vec, int64_t unroll, const std::string& indent,
                     std::ostringstream& os);
void emitGroupLoads(const Region& r, const IndexPlan& p, int64_t vec, const std::string& flat, const std::string& itype,
                    const std::string& slot, const std::string& indent, std::ostringstream& os);
// The math of one loaded group: per element (lane `k` when vec > 1) the region's exprs, then
// `consume(indent)` (e.g. the reduction's combine), then the stores (one vector store per output).
void emitGroupCompute(const Region& r, const IndexPlan& p, int64_t vec, const std::string& flat,
                      const std::string& slot, const std::string& indent, std::ostringstream& os,
                      const std::function<void(const std::string&)>& consume = {});
// "expr * n" (or expr when n == 1), parenthesized when expr is a sum.
std::string timesText(const std::string& expr, int64_t n);

// ---- kernels ----
std::string emitPointwise(const Analysis& a, const Schedule& s, const std::string& name_token);
std::string emitReduction(const Analysis& a, const Schedule& s, const std::string& name_token);
std::string emitNormalization(const Analysis& a, const Schedule& s, const std::string& name_token);
std::string emitTranspose(const Analysis& a, const Schedule& s, const std::string& name_token);

// scheduler.cpp helpers shared with normalization.cpp
bool scheduleNormalization(const Analysis& a, const CodegenOptions& options, Schedule* s, std::string* why);
int64_t floorPow2(int64_t v);
int64_t ceilDiv(int64_t a, int64_t b);

}  // namespace codegen
}  // namespace mf
