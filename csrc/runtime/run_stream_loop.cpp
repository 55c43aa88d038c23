// Runs one StreamLoop (host/stream_loops.cpp): the contraction and its communication chunk by
// chunk. Communications are posted one chunk ahead of the compute that needs them (or waited one
// chunk late after the compute that made them), so that one chunk's communication overlaps the
// next chunk's GEMM; at most two chunk buffers are alive at a time, and each chunk's result is
// written straight into its rows of the loop's result.
//
// On CUDA each chunk runs on one of a few streams from PyTorch's pool (a ring on one: its buffers
// pass from step to step): every worker stream first waits for the current stream (the inputs are
// ready), and the current stream waits for every worker at the end (events). On CPU the same
// program runs on the calling thread; Gloo's work
// runs in its own threads, so the overlap is real there too.
#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <deque>
#include <optional>

#include "host/communication_bytes.h"
#include "multidevice/sharding.h"
#include "runtime/block_layout.h"
#include "runtime/executor.h"
#include "runtime/profiler.h"
#include "support/error.h"

namespace mf {
namespace {

// [.., P*s*c, ..] -> rows of chunk j: [.., P*c, ..] (a view when P == 1; else a copy).
at::Tensor chunkRows(const at::Tensor& t, int64_t axis, int64_t blocks, int64_t chunks, int64_t j) {
  int64_t rows = t.size(axis);
  MF_CHECK(rows % (blocks * chunks) == 0, "axis ", axis, " of extent ", rows, " does not split into ", blocks, " x ",
           chunks);
  int64_t c = rows / (blocks * chunks);
  if (blocks == 1) return t.narrow(axis, j * c, c);
  std::vector<int64_t> shape = t.sizes().vec();
  shape[axis] = c;
  shape.insert(shape.begin() + axis, chunks);
  shape.insert(shape.begin() + axis, blocks);
  at::Tensor picked = t.reshape(shape).select(axis + 1, j);  // [.., P, c, ..]
  std::vector<int64_t> flat = t.sizes().vec();
  flat[axis] = blocks * c;
  return picked.reshape(flat);
}

// Writes `src` ([.., P*c, ..]) into the rows of chunk j of `dst` ([.., P*s*c, ..]).
void writeChunkRows(at::Tensor& dst, int64_t axis, int64_t blocks, int64_t chunks, int64_t j, const at::Tensor& src) {
  int64_t c = dst.size(axis) / (blocks * chunks);
  if (blocks == 1) {
    dst.narrow(axis, j * c, c).copy_(src);
    return;
  }
  std::vector<int64_t> shape = dst.sizes().vec();
  shape[axis] = c;
  shape.insert(shape.begin() + axis, chunks);
  shape.insert(shape.begin() + axis, blocks);
  at::Tensor view = dst.view(shape).select(axis + 1, j);  // dst is ours and contiguous
  std::vector<int64_t> src_shape = src.sizes().vec();
  src_shape[axis] = c;
  src_shape.insert(src_shape.begin() + axis, blocks);
  view.copy_(src.reshape(src_shape));
}

// The pair group a ring step talks on (stream_loops.cpp adds every ring pair to the teams).
std::vector<int64_t> pairTeam(int64_t a, int64_t b) { return {std::min(a, b), std::max(a, b)}; }

// A few worker streams from PyTorch's pool (CUDA only), ordered after the current stream on entry
// and before it on exit. Chunk j runs on worker j % size. Degenerate (no streams) on CPU.
class ChunkStreams {
 public:
  ChunkStreams(const at::Tensor& like, int64_t chunks) {
    if (!like.is_cuda()) return;
    impl_.emplace(c10::DeviceType::CUDA);
    c10::Device device = like.device();
    main_ = impl_->getStream(device);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(*main_);
    for (int64_t i = 0; i < std::min<int64_t>(chunks, 3); ++i) {
      workers_.push_back(impl_->getStreamFromGlobalPool(device, /*isHighPriority=*/false));
      ready.block(workers_.back());
    }
  }
  ~ChunkStreams() {
    if (!impl_) return;
    for (const c10::Stream& w : workers_) {
      c10::Event done(c10::DeviceType::CUDA);
      done.record(w);
      done.block(*main_);
    }
  }
  // Makes chunk j's worker the current stream while alive (nothing on CPU).
  std::optional<c10::StreamGuard> on(int64_t j) const {
    if (workers_.empty()) return std::nullopt;
    return std::optional<c10::StreamGuard>(std::in_place, workers_[j % workers_.size()]);
  }

 private:
  std::optional<c10::impl::VirtualGuardImpl> impl_;
  std::optional<c10::Stream> main_;
  std::vector<c10::Stream> workers_;
};

}  // namespace

void FusionExecutor::runStreamLoop(int64_t index, std::unordered_map<const Val*, at::Tensor>& values,
                                   const std::unordered_map<const Val*, c10::Scalar>& scalars,
                                   const ExtentBindings& bindings) {
  const StreamLoop& loop = program_->streamLoops()[index];
  const Communication& c = program_->communications()[loop.communication];
  Communicator& comm = *comm_;
  const int64_t rank = program_->rank();
  const int64_t n = static_cast<int64_t>(c.team.size());
  const int64_t me = Communicator::indexIn(c.team, rank);
  const bool solo = n == 1;
  const Expr* gemm = loop.contraction;
  const int64_t rows = globalRows(loop, bindings);
  const int64_t s = effectiveChunks(loop, rows);

  std::vector<RuntimeValue> operands;
  for (const Val* v : gemm->inputs()) {
    RuntimeValue rv;
    if (v->isTensor()) {
      auto it = values.find(v);
      if (it != values.end()) rv.tensor = it->second;
    } else {
      rv = scalarRuntimeValue(v, scalars, bindings);
    }
    operands.push_back(rv);
  }
  // The contraction on some rows of its first operand; the partials' device axis dropped.
  auto gemm_on = [&](const at::Tensor& x_rows) {
    RECORD_FUNCTION("meshfuser::stream_chunk_gemm", std::vector<c10::IValue>());
    std::vector<RuntimeValue> ins = operands;
    ins[0].tensor = x_rows;
    at::Tensor out = evaluateExpr(gemm, ins, bindings).at(0);
    if (c.layout.drop_axis >= 0) out = out.squeeze(c.layout.drop_axis);
    return out;
  };
  ProfileRecorder* profile = ProfileRecorder::active();
  TransferBytes total = mf::communicationBytes(c, rank, bindings);
  const bool ring = isRing(loop.kind);
  const int64_t transfers = ring ? std::max<int64_t>(s - 1, 1) : s;
  auto record = [&](const std::string& what, int64_t j) {
    if (!profile) return;
    profile->kernels().push_back({mf::str("segment ", loop.segment, " chunk ", j), "expr_eval"});
    if (solo) return;
    profile->kernels().push_back({mf::str(what, " ", c.output->toString(), " <- ", c.input->toString(), " stream loop ",
                                          index, " chunk ", j, "/", s),
                                  "communication", total.sent / transfers, total.received / transfers});
  };
  auto wait_all = [&](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    try {
      for (auto& w : works) w->wait();
    } catch (const std::exception& e) {
      throw collectiveFailure(comm, c, rank, e);
    }
    works.clear();
  };

  // The result: the loop writes every chunk's rows into it.
  auto result_shape = localShape(loop.result, globalShape(loop.result, bindings));
  const at::Tensor& first = operands[0].tensor.defined() ? operands[0].tensor : values.at(c.input);
  at::Tensor result = at::empty(result_shape, first.options().dtype(toAten(loop.result->dtype())));
  // A ring hands each received buffer to the next step: one worker stream keeps the caching
  // allocator's stream bookkeeping exact; NCCL's own stream still overlaps it with the GEMMs.
  ChunkStreams streams(first, ring ? 1 : s);

  switch (loop.kind) {
    case StreamLoopKind::GemmReduceScatter:
    case StreamLoopKind::GemmAllreduce: {
      const bool scatter = loop.kind == StreamLoopKind::GemmReduceScatter;
      struct InFlight {
        int64_t j;
        at::Tensor send, recv;
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
      };
      std::deque<InFlight> flight;
      auto finish = [&](InFlight& f) {
        auto guard = streams.on(f.j);
        wait_all(f.works);
        if (scatter) {
          if (f.recv.defined()) result.narrow(loop.result_row_axis, f.j * (result.size(loop.result_row_axis) / s),
                                              result.size(loop.result_row_axis) / s).copy_(f.recv);
        } else {
          writeChunkRows(result, loop.result_row_axis, loop.blocks, s, f.j, f.send);
        }
      };
      const at::Tensor& x = operands[0].tensor;
      // A chunk of a scatter's own axis takes its rows from every member's block.
      const int64_t blocks = scatter && !loop.independent ? n : loop.blocks;
      const int64_t scatter_axis = c.layout.send_blocks_axis >= 0 ? c.layout.send_blocks_axis : loop.part_row_axis;
      for (int64_t j = 0; j < s; ++j) {
        auto guard = streams.on(j);
        at::Tensor part = gemm_on(chunkRows(x, loop.x_row_axis, blocks, s, j));
        InFlight f{j, {}, {}, {}};
        if (scatter) {
          f.send = blocksOutermost(part, scatter_axis, n);
          int64_t c_rows = result.size(loop.result_row_axis) / s;
          at::Tensor dst = result.narrow(loop.result_row_axis, j * c_rows, c_rows);
          // Straight into the result when its chunk is contiguous, else through a buffer.
          f.recv = dst.is_contiguous() ? at::Tensor() : at::empty(dst.sizes(), dst.options());
          at::Tensor out = f.recv.defined() ? f.recv : dst;
          if (solo) out.copy_(f.send[0]);
          else f.works.push_back(comm.reduceScatter(c.team, out, f.send, c.reduce_op));
        } else {
          f.send = part.contiguous();
          if (!solo) f.works.push_back(comm.allreduce(c.team, f.send, c.reduce_op));
        }
        record(scatter ? "ReduceScatter" : "Allreduce", j);
        flight.push_back(std::move(f));
        if (flight.size() > 1) {  // chunk j-1's communication ran during chunk j's GEMM
          finish(flight.front());
          flight.pop_front();
        }
      }
      while (!flight.empty()) {
        finish(flight.front());
        flight.pop_front();
      }
      break;
    }
    case StreamLoopKind::AllgatherGemm: {
      const at::Tensor shard = values.at(c.input);
      // A set keeps the axes: the shard's chunked axis is the gathered tensor's.
      const int64_t shard_axis = loop.x_row_axis;
      const int64_t merge_axis = c.layout.recv_merge_axis >= 0 ? c.layout.recv_merge_axis : loop.x_row_axis;
      const int64_t c_rows = shard.size(shard_axis) / s;
      struct InFlight {
        at::Tensor send, buf;
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
      };
      auto post = [&](int64_t j) {
        auto guard = streams.on(j);
        InFlight f;
        f.send = shard.narrow(shard_axis, j * c_rows, c_rows).contiguous();
        std::vector<int64_t> shape = f.send.sizes().vec();
        shape.insert(shape.begin(), n);
        if (solo) {
          f.buf = f.send.unsqueeze(0);
        } else {
          f.buf = at::empty(shape, f.send.options());
          f.works.push_back(comm.allgather(c.team, f.buf, f.send));
        }
        record("Allgather", j);
        return f;
      };
      std::deque<InFlight> flight;
      flight.push_back(post(0));
      for (int64_t j = 0; j < s; ++j) {
        if (j + 1 < s) flight.push_back(post(j + 1));  // chunk j+1's gather runs during chunk j's GEMM
        auto guard = streams.on(j);
        InFlight f = std::move(flight.front());
        flight.pop_front();
        wait_all(f.works);
        at::Tensor gathered = mergeBlocks(f.buf, merge_axis);
        writeChunkRows(result, loop.result_row_axis, loop.independent ? 1 : n, s, j, gemm_on(gathered));
      }
      break;
    }
    case StreamLoopKind::BroadcastGemm: {
      const at::Tensor shard = values.at(c.input).contiguous();
      struct InFlight {
        at::Tensor buf;
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
      };
      auto post = [&](int64_t j) {
        auto guard = streams.on(j);
        InFlight f;
        f.buf = j == me ? shard : at::empty_like(shard);
        f.works.push_back(comm.broadcast(c.team, f.buf, c.team[j]));
        record("Broadcast", j);
        return f;
      };
      std::deque<InFlight> flight;
      flight.push_back(post(0));
      for (int64_t j = 0; j < s; ++j) {
        if (j + 1 < s) flight.push_back(post(j + 1));
        auto guard = streams.on(j);
        InFlight f = std::move(flight.front());
        flight.pop_front();
        wait_all(f.works);
        writeChunkRows(result, loop.result_row_axis, 1, s, j, gemm_on(f.buf));
      }
      break;
    }
    case StreamLoopKind::RingAllgatherGemm: {
      // Step i: this rank holds team member (me - i)'s shard, multiplies it into that member's rows
      // and passes it on to me + 1 while receiving the next one from me - 1.
      at::Tensor held = values.at(c.input).contiguous();
      const int64_t next = c.team[(me + 1) % n], prev = c.team[(me + n - 1) % n];
      for (int64_t i = 0; i < s; ++i) {
        auto guard = streams.on(i);
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        at::Tensor incoming;
        if (i + 1 < s) {
          incoming = at::empty_like(held);
          auto send = [&] { works.push_back(comm.send(pairTeam(rank, next), held, next)); };
          auto recv = [&] { works.push_back(comm.recv(pairTeam(rank, prev), incoming, prev)); };
          // Even members send first, odd ones receive first: matched order on a shared pair group.
          if (me % 2 == 0) send(), recv();
          else recv(), send();
          record("SendRecv", i);
        }
        int64_t block = (me - i + n) % n;
        writeChunkRows(result, loop.result_row_axis, 1, s, block, gemm_on(held));
        wait_all(works);
        if (incoming.defined()) held = incoming;
      }
      break;
    }
    case StreamLoopKind::RingGemmReduceScatter: {
      // Step i: the partial GEMM of block (me + i + 1) plus the sum received from me + 1, sent on to
      // me - 1; the last step's block is this rank's own: its full sum.
      const at::Tensor& x = operands[0].tensor;
      const int64_t next = c.team[(me + 1) % n], prev = c.team[(me + n - 1) % n];
      std::vector<c10::intrusive_ptr<c10d::Work>> recv_works, send_works;
      at::Tensor incoming, outgoing;
      for (int64_t i = 0; i < s; ++i) {
        auto guard = streams.on(i);
        int64_t block = (me + i + 1) % n;
        at::Tensor part = gemm_on(chunkRows(x, loop.x_row_axis, 1, s, block));
        if (i > 0) {
          wait_all(recv_works);
          part = part.add_(incoming);
          wait_all(send_works);  // the previous sum left: its buffer may go
        }
        if (i + 1 < s) {
          outgoing = part.contiguous();
          incoming = at::empty_like(outgoing);
          auto send = [&] { send_works.push_back(comm.send(pairTeam(rank, prev), outgoing, prev)); };
          auto recv = [&] { recv_works.push_back(comm.recv(pairTeam(rank, next), incoming, next)); };
          if (me % 2 == 0) send(), recv();
          else recv(), send();
          record("SendRecv", i);
        } else {
          result.copy_(part.reshape(result.sizes()));
        }
      }
      break;
    }
  }
  values[loop.result] = result;
}

}  // namespace mf
