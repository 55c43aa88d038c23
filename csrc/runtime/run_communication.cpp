// Runs one lowered Communication on local tensors: lays buffers out as its CommunicationLayout says
// (decided at lowering, see host/communication_layout.cpp), posts it, and registers the local
// reshuffle that finishes it after the wait.
#include <algorithm>

#include "multidevice/communicator.h"
#include "runtime/block_layout.h"
#include "multidevice/sharding.h"
#include "runtime/executor.h"
#include "runtime/interleaved_blocks.h"
#include "support/error.h"

namespace mf {

void requireCommunicatorFor(const HostProgram& program, const Communicator& comm) {
  const Fusion& f = program.fusion();
  // With a communicator, meshes against the world are checked with the per-call agreement
  // (runtime/call_checks.cpp: meshWorldError), on every rank.
  if (comm.initialized()) return;
  auto check = [&](const Val* v) {
    if (!v->isTensor()) return;
    const DeviceMesh& mesh = static_cast<const TensorView*>(v)->mesh();
    MF_USER_CHECK(mesh.size() <= 1, "execute: ", static_cast<const TensorView*>(v)->label(), " lives on mesh ", mesh.toString(), " of ", mesh.size(),
                  " devices, but the Communicator is not initialized, so this process cannot know its rank nor ",
                  "reach the other devices. Initialize it first: from Python, meshfuser.Communicator.instance() ",
                  "(under torchrun); from C++, pass a meshfuser::Communicator made from your c10d::ProcessGroup or ",
                  "from meshfuser::Communicator::fromEnvironment()");
  };
  for (const Val* v : f.inputs()) check(v);
  for (const Val* v : f.outputs()) check(v);
  for (const Communication& c : program.communications()) check(c.output);
}

void FusionExecutor::runCommunication(const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                                      const ExtentBindings& bindings, std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  Communicator& comm = *comm_;
  const int64_t rank = program_->rank();
  c10::intrusive_ptr<c10d::Work> work;
  // Whatever `work` holds when this function returns is waited for at the communication's Wait.
  struct Keep {
    c10::intrusive_ptr<c10d::Work>& work;
    std::vector<c10::intrusive_ptr<c10d::Work>>& works;
    ~Keep() {
      if (work) works.push_back(work);
    }
  } keep{work, works};
  const int64_t n = static_cast<int64_t>(c.team.size());
  auto input = [&]() -> at::Tensor {
    auto it = values.find(c.input);
    MF_CHECK(it != values.end(), "no value for communication input ", c.input->toString());
    return it->second;
  };
  auto finish = [&](std::function<at::Tensor()> fn) { pending_finish_[c.output] = std::move(fn); };
  auto out_options = [&](const at::Tensor& like) { return like.options().dtype(toAten(c.output->dtype())); };
  // An uninitialized Communicator with n > 1 was refused by requireCommunicatorFor.
  bool solo = n == 1;

  switch (c.type) {
    case CommunicationType::NoOp: {
      at::Tensor x = input();
      if (c.layout.drop_axis >= 0) x = x.squeeze(c.layout.drop_axis);
      finish([x] { return x; });
      return;
    }
    case CommunicationType::LocalSlice: {
      at::Tensor x = input();
      int64_t me = Communicator::indexIn(c.team, rank);
      // Validation refuses uneven shards before anything runs; never drop rows silently.
      const int64_t axis = c.layout.slice_axis;
      MF_USER_CHECK(x.size(axis) % n == 0, "execute: ", c.output->toString(), " axis ", axis, ": extent ",
                    x.size(axis), " does not split evenly over ", n, " devices; uneven sharding is not supported");
      int64_t len = x.size(axis) / n;
      if (c.layout.by_index) {
        at::Tensor index =
            teamIndex({c.output, axis, c.output, axis, c.pt, c.input, axis}, rank, n, bindings, x.device());
        at::Tensor mine = x.index_select(axis, index.narrow(0, me * len, len));
        finish([mine] { return mine; });
        return;
      }
      at::Tensor slice = x.narrow(axis, me * len, len);
      finish([slice] { return slice; });
      return;
    }
    case CommunicationType::Allgather: {
      at::Tensor x = input().contiguous();
      if (solo) {
        finish([x] { return x; });
        return;
      }
      std::vector<int64_t> buf_shape = x.sizes().vec();
      buf_shape.insert(buf_shape.begin(), n);
      at::Tensor buf = at::empty(buf_shape, x.options());
      work = comm.allgather(c.team, buf, x);
      int64_t axis = c.layout.recv_merge_axis;
      if (c.layout.by_index) {
        at::Tensor index =
            teamIndex({c.input, shardedAxis(c.input, c.pt), c.output, axis, c.pt}, rank, n, bindings, x.device());
        finish([buf, axis, index] { return mergeMembersByIndex(buf, axis, index); });
        return;
      }
      finish([buf, axis] { return mergeBlocks(buf, axis); });
      return;
    }
    case CommunicationType::ReduceScatter: {
      at::Tensor x = input().squeeze(c.layout.drop_axis);
      const int64_t axis = c.layout.send_blocks_axis;
      at::Tensor send =
          c.layout.by_index
              ? memberBlocksByIndex(x, axis,
                                    teamIndex({c.output, axis, c.output, axis, c.pt, c.input,
                                               axis < c.layout.drop_axis || c.layout.drop_axis < 0 ? axis : axis + 1},
                                              rank, n, bindings, x.device()),
                                    n)
              : blocksOutermost(x, axis, n);
      std::vector<int64_t> out_shape(send.sizes().begin() + 1, send.sizes().end());
      at::Tensor buf = at::empty(out_shape, x.options());
      if (solo) {
        buf.copy_(send[0]);
      } else {
        work = comm.reduceScatter(c.team, buf, send, c.reduce_op);
      }
      // buf already has the output's axis order: the blocks were only moved out of the way.
      finish([buf] { return buf; });
      return;
    }
    case CommunicationType::Allreduce: {
      // Reduce in place only into memory nothing else can see: the partial may be read elsewhere,
      // and it may be a view (a LocalSlice's narrow, a set or permute) of another tensor, even
      // of the caller's input, which an in-place Allreduce once overwrote with the sum.
      const Fusion& f = program_->fusion();
      const at::Tensor partial = input();
      const bool owned = c.input->uses().size() == 1 && !f.isInput(c.input) && !f.isOutput(c.input) &&
                         partial.storage().use_count() == 1;  // no other tensor views this memory
      at::Tensor x = partial.squeeze(c.layout.drop_axis);
      at::Tensor buf = owned ? x.contiguous() : x.clone(at::MemoryFormat::Contiguous);
      if (!solo) work = comm.allreduce(c.team, buf, c.reduce_op);
      finish([buf] { return buf; });
      return;
    }
    case CommunicationType::AllToAll: {
      at::Tensor x = input();
      const int64_t send_axis = c.layout.send_blocks_axis, merge_axis = c.layout.recv_merge_axis;
      at::Tensor send =
          c.layout.by_index
              ? memberBlocksByIndex(x, send_axis,
                                    teamIndex({c.output, send_axis, c.input, send_axis, c.pt}, rank, n, bindings, x.device()), n)
              : blocksOutermost(x, send_axis, n);
      at::Tensor recv = at::empty_like(send);
      if (!solo) work = comm.allToAll(c.team, recv, send);
      else recv.copy_(send);
      // recv[j] is team member j's block of our out_axis slice; member j held block j of in_axis.
      if (c.layout.by_index) {
        at::Tensor index = teamIndex({c.input, merge_axis, c.output, merge_axis, c.pt}, rank, n, bindings, x.device());
        finish([recv, merge_axis, index] { return mergeMembersByIndex(recv, merge_axis, index); });
        return;
      }
      finish([recv, merge_axis] { return mergeBlocks(recv, merge_axis); });
      return;
    }
    case CommunicationType::Broadcast: {
      at::Tensor buf;
      if (rank == c.root) {
        buf = input().contiguous();
      } else {
        auto shape = localShape(c.output, globalShape(c.output, bindings));
        at::Tensor like = values.empty() ? at::empty({0}) : values.begin()->second;
        buf = at::empty(shape, out_options(like));
      }
      work = comm.broadcast(c.team, buf, c.root);
      bool receives = c.output->mesh().has(rank);
      if (receives) finish([buf] { return buf; });
      return;
    }
    case CommunicationType::ExpertCounts:
    case CommunicationType::Dispatch:
    case CommunicationType::Combine: MF_THROW_INTERNAL("the exchanges run in runExchange");
    case CommunicationType::SendRecv:
    case CommunicationType::Gather:
    case CommunicationType::Scatter:
      runPointToPoint(c, values, bindings, works);
      return;
  }
}

void FusionExecutor::runPointToPoint(const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                                     const ExtentBindings& bindings,
                                     std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  Communicator& comm = *comm_;
  const int64_t rank = program_->rank();
  auto local_of = [&](const TensorView* tv) { return localShape(tv, globalShape(tv, bindings)); };
  at::TensorOptions options;
  for (const auto& [v, t] : values) {
    options = t.options();
    break;
  }
  options = options.dtype(toAten(c.output->dtype()));
  auto mine = [&]() -> at::Tensor { return values.at(c.input); };
  // Receivers allocate one buffer per incoming piece; pieces[i] belongs to pairs[i].
  std::vector<at::Tensor> pieces(c.pairs.size());
  std::vector<at::Tensor> keep_alive;
  const int64_t n_receivers = static_cast<int64_t>(c.output->mesh().size());
  for (size_t i = 0; i < c.pairs.size(); ++i) {
    auto [sender, receiver] = c.pairs[i];
    if (sender != rank && receiver != rank) continue;
    std::vector<int64_t> team = {std::min(sender, receiver), std::max(sender, receiver)};
    // What the sender contributes for this pair.
    auto outgoing = [&]() -> at::Tensor {
      at::Tensor x = mine();
      if (c.type != CommunicationType::Scatter) return x.contiguous();
      int64_t block = c.output->mesh().linearIndexOf(receiver);
      const int64_t axis = c.layout.slice_axis;
      MF_USER_CHECK(x.size(axis) % n_receivers == 0, "execute: ", c.output->toString(), " axis ", axis, ": extent ",
                    x.size(axis), " does not split evenly over ", n_receivers, " devices; uneven sharding is not supported");
      int64_t len = x.size(axis) / n_receivers;
      return x.narrow(axis, block * len, len).contiguous();
    };
    if (sender == receiver) {
      pieces[i] = outgoing();
    } else if (sender == rank) {
      at::Tensor x = outgoing();
      keep_alive.push_back(x);
      works.push_back(comm.send(team, x, receiver));
    } else {
      std::vector<int64_t> shape = c.type == CommunicationType::Gather ? local_of(c.input) : local_of(c.output);
      pieces[i] = at::empty(shape, options);
      works.push_back(comm.recv(team, pieces[i], sender));
    }
  }
  if (!c.output->mesh().has(rank)) {
    // A pure sender: the outgoing buffers must live until the sends complete.
    pending_finish_[c.output] = [keep_alive] { return at::Tensor(); };
    return;
  }
  std::vector<at::Tensor> received;
  for (size_t i = 0; i < c.pairs.size(); ++i) {
    if (c.pairs[i].second == rank) received.push_back(pieces[i]);
  }
  int64_t axis = c.layout.recv_merge_axis;
  bool gather = c.type == CommunicationType::Gather;
  pending_finish_[c.output] = [received, axis, gather, keep_alive] {
    return gather ? at::cat(received, axis) : received.at(0);
  };
}

}  // namespace mf
