// The per-rank host program: what one rank runs, in order. Compute segments (runs of
// non-resharding exprs), communications (one per resharding expr), waits and deallocations.
// Plain C++: the runtime interprets it with ATen and c10d.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/fusion.h"

namespace mf {

// NoOp: a collective on a one-device team; nothing is posted (the output is the input, with the
// partials' device axis dropped for a reduction).
// The expert-parallel exchange (ir/ops_exchange.cpp): ExpertCounts, an AllToAll of the rows each
// team member's experts get from this rank (and whether this rank's counts are valid); Dispatch and
// Combine, AllToAllV of rows with split sizes from those counts (printed "AllToAllV").
enum class CommunicationType {
  Allgather, ReduceScatter, Allreduce, LocalSlice, AllToAll, Broadcast, Gather, Scatter, SendRecv, NoOp,
  ExpertCounts, Dispatch, Combine
};
// The exchanges, whose bytes depend on the data (the counts), not on extents alone.
inline bool isExchange(CommunicationType t) {
  return t == CommunicationType::ExpertCounts || t == CommunicationType::Dispatch || t == CommunicationType::Combine;
}
const char* toString(CommunicationType t);

// How a communication's buffers are laid out around the c10d primitive: decided at lowering
// (communication_layout.cpp) and printed; the runtime only carries it out.
struct CommunicationLayout {
  int64_t drop_axis = -1;         // the partials' device axis (local extent 1), removed before sending
  int64_t send_blocks_axis = -1;  // send the input cut into team-size blocks along this axis, blocks first
  int64_t recv_merge_axis = -1;   // the received [team, ...] blocks concatenate along this axis
  int64_t slice_axis = -1;        // keep this rank's block along this axis (no data moves)
  bool send_copies = false;       // the send layout needs a copy (the blocks are not already outermost)
  // A device split of the communicated axis is not one block per device (an inner split, say): the
  // blocks and the merge are gathered and scattered by index (one copy each way), not reshaped.
  bool by_index = false;
  std::string toString() const;
};

struct Communication {
  CommunicationType type = CommunicationType::Allgather;
  TensorView* input = nullptr;
  TensorView* output = nullptr;
  ParallelType pt = ParallelType::DIDx;
  std::vector<int64_t> team;  // ranks, in mesh order; empty when this rank takes no part
  int64_t root = -1;          // Broadcast/Gather/Scatter: root rank
  OpType reduce_op = OpType::Sum;
  int64_t in_axis = -1;       // input runtime axis that is split across the team (AllToAll, SendRecv)
  int64_t out_axis = -1;      // output runtime axis that is split across the team (gathered/scattered)
  int64_t reduced_axis = -1;  // input runtime axis holding the per-device partials (reductions)
  // The exchanges: this rank's rows per expert, and the rows each source sends each local expert
  // (Dispatch, Combine; the ExpertCounts that made them has only `counts`). `rows`: the tensor
  // whose row count the counts must cover (ExpertCounts: the dispatch's tokens).
  TensorView* counts = nullptr;
  TensorView* recv_counts = nullptr;
  TensorView* rows = nullptr;
  // For SendRecv: pairs (sender, receiver).
  std::vector<std::pair<int64_t, int64_t>> pairs;
  CommunicationLayout layout;
  std::string toString() const;
};

struct Segment {
  std::vector<Expr*> exprs;
  // Intermediates and inputs this segment reads last (deallocated or released right after it): a
  // generated kernel may write an output of the same size and dtype into one's buffer when nothing
  // else references it (runtime/segment_kernels.cpp).
  std::vector<const Val*> last_reads;
  // exprs are {g = gemm(a, b), s = add(partial, g)}: run as partial += a @ b in the partial's buffer
  // (cuBLAS beta = 1) where nothing else holds it (host/gemm_accumulate.cpp).
  bool gemm_accumulate = false;
  std::string toString() const;
};

// A stream-parallel loop (ParallelType.stream, or the fusion's overlap option): one contraction
// segment and the communication next to it, run chunk by chunk so that one chunk's communication
// overlaps another chunk's compute (host/stream_loops.cpp decides it, runtime/run_stream_loop.cpp
// runs it). Rows: the contraction's non-contracted operand axis the loop cuts, seen as
// [blocks][chunks][rows per chunk] in global row order.
enum class StreamLoopKind {
  GemmReduceScatter,      // chunk: partial GEMM of the chunk's rows, then their ReduceScatter
  GemmAllreduce,          // chunk: partial GEMM of the chunk's rows, then their Allreduce
  AllgatherGemm,          // chunk: Allgather of the chunk's rows, then their GEMM
  BroadcastGemm,          // step j: team member j broadcasts its shard, then everyone multiplies it
  RingAllgatherGemm,      // step i: multiply the shard held, pass it to the next rank (send/recv)
  RingGemmReduceScatter,  // step i: partial GEMM of a block plus the sum received, passed on
};
const char* toString(StreamLoopKind k);
inline bool isRing(StreamLoopKind k) {
  return k == StreamLoopKind::RingAllgatherGemm || k == StreamLoopKind::RingGemmReduceScatter;
}

struct StreamLoop {
  StreamLoopKind kind = StreamLoopKind::GemmReduceScatter;
  int64_t chunks = 1;           // trip count (ring and broadcast kinds: the team size)
  bool chunks_adjustable = false;  // chosen by the overlap option: fewer chunks when rows do not divide
  int64_t blocks = 1;           // team blocks outside the chunks ([blocks][chunks][rows])
  // The loop cuts an axis the communication does not touch (a batch axis): every chunk runs the
  // whole communication on its slice (blocks 1).
  bool independent = false;
  int64_t segment = -1;         // the contraction's segment
  int64_t communication = -1;   // the communication it overlaps (type, team, layout, bytes)
  Expr* contraction = nullptr;
  TensorView* result = nullptr;  // what the loop writes, chunk by chunk
  int64_t x_row_axis = -1;       // runtime axis of the contraction's first operand that is cut
  int64_t part_row_axis = -1;    // ... of the contraction's output (partial axis dropped)
  int64_t result_row_axis = -1;  // ... of `result`
  TensorView* scheduled = nullptr;  // the tensor whose stream axis asked for the loop (null: the option)
  int64_t scheduled_axis = -1;
  std::string toString() const;
};

struct HostInstruction {
  enum class Kind { RunSegment, PostCommunication, Wait, Deallocate, StreamLoop };
  Kind kind;
  int64_t index = -1;       // segment, communication or stream loop index
  TensorView* tv = nullptr;  // Deallocate: an intermediate freed, or an input the program stops referencing
};

class HostProgram {
 public:
  HostProgram(std::unique_ptr<Fusion> fusion, int64_t rank) : fusion_(std::move(fusion)), rank_(rank) {}
  Fusion& fusion() const { return *fusion_; }
  int64_t rank() const { return rank_; }
  std::vector<Segment>& segments() { return segments_; }
  const std::vector<Segment>& segments() const { return segments_; }
  std::vector<Communication>& communications() { return communications_; }
  const std::vector<Communication>& communications() const { return communications_; }
  std::vector<StreamLoop>& streamLoops() { return stream_loops_; }
  const std::vector<StreamLoop>& streamLoops() const { return stream_loops_; }
  std::vector<HostInstruction>& instructions() { return instructions_; }
  const std::vector<HostInstruction>& instructions() const { return instructions_; }
  // Every team any rank uses, in the same order on all ranks (c10d groups are created from it).
  std::vector<std::vector<int64_t>>& teams() { return teams_; }
  const std::vector<std::vector<int64_t>>& teams() const { return teams_; }
  // `schedulers`, when given, names what runs each segment ("expr_eval", "pointwise", ...): the
  // runtime's choice, shown beside the compiled program without being written into it.
  // `bytes`, when given, holds {sent, received} per communication (communication_bytes.h); each
  // communication then shows its bytes and the program its total.
  // `loop_chunks`, when given, holds the chunk count each stream loop ran with (an adjustable one
  // may run fewer than it was planned with).
  std::string toString(const std::vector<std::string>& schedulers = {},
                       const std::vector<std::pair<int64_t, int64_t>>& bytes = {},
                       const std::vector<int64_t>& loop_chunks = {}, bool show_deallocations = true) const;

 private:
  std::unique_ptr<Fusion> fusion_;
  int64_t rank_;
  std::vector<Segment> segments_;
  std::vector<Communication> communications_;
  std::vector<HostInstruction> instructions_;
  std::vector<StreamLoop> stream_loops_;
  std::vector<std::vector<int64_t>> teams_;
};

// Decides every communication's buffer layout (see CommunicationLayout).
void planCommunicationLayouts(HostProgram& hp);

// Turns each contraction + communication pair that a stream axis (or the fusion's overlap option)
// asks to overlap into a StreamLoop; refuses stream axes it cannot honour (host/stream_loops.cpp).
void planStreamLoops(HostProgram& hp);
// Rows per chunk check for a run: an error naming the tensor, axis, extent and chunks, or "".
// `row_extent(loop)` gives the global row extent of the loop's result for the run.
std::string checkStreamLoopExtents(const HostProgram& hp, const std::unordered_map<std::string, int64_t>& extents);
// The chunk count a loop runs with for these extents (an adjustable one shrinks to a divisor).
int64_t effectiveChunks(const StreamLoop& loop, int64_t global_rows);
int64_t globalRows(const StreamLoop& loop, const std::unordered_map<std::string, int64_t>& extents);

// Lowers a fusion that went through the pass pipeline into `rank`'s host program.
std::unique_ptr<HostProgram> lowerToHostProgram(std::unique_ptr<Fusion> fusion, int64_t rank);

}  // namespace mf
