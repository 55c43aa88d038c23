// Runs the expert-parallel exchanges (ir/ops_exchange.cpp, lowered by host/lower.cpp):
//   ExpertCounts  an AllToAll of [team, local experts + 1] int64: the rows this rank sends each team
//                 member's experts, and a flag saying whether its counts cover its rows. Every rank
//                 receives every sender's flag, so a bad count raises on every rank before any row
//                 moves (the agreement for data-dependent extents: each received extent is the sum
//                 of what the senders announced, so sender and receiver agree on every split).
//   Dispatch      an AllToAllV of the token rows with those splits; the received rows, ordered by
//                 source and then expert, are regrouped by local expert, then source. Binds the
//                 received row count (a data-dependent extent) for the rest of the call.
//   Combine       the reverse: rows regrouped by source, then an AllToAllV with the splits swapped.
// Bytes are counted from the splits: rows that leave or reach this rank (its own block stays).
#include <numeric>

#include "multidevice/communicator.h"
#include "runtime/executor.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

std::vector<int64_t> hostLongs(const at::Tensor& t) {
  at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

int64_t sum(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX) {
  return std::accumulate(v.begin() + from, v.begin() + std::min(to, v.size()), int64_t{0});
}

// Rows per (source s, local expert j), source-major: the order an AllToAllV delivers them in.
// Returns the row index, in that buffer, of each row in (expert, source) order (`expert_major`), or
// the inverse permutation.
at::Tensor regroupIndex(const std::vector<int64_t>& recv, int64_t n, int64_t e, bool expert_major, c10::Device dev) {
  std::vector<int64_t> start(n * e);
  int64_t at = 0;
  for (int64_t k = 0; k < n * e; ++k) {
    start[k] = at;
    at += recv[k];
  }
  std::vector<int64_t> index;
  index.reserve(at);
  for (int64_t j = 0; j < e; ++j) {
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t r = 0; r < recv[s * e + j]; ++r) index.push_back(start[s * e + j] + r);
    }
  }
  at::Tensor perm = at::tensor(index, at::TensorOptions().dtype(at::kLong));
  if (!expert_major) perm = at::argsort(perm);  // the inverse: buffer row -> (expert, source) position
  return perm.to(dev);
}

at::Tensor rowsLike(const at::Tensor& x, int64_t rows) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  return at::empty(shape, x.options());
}

}  // namespace

void FusionExecutor::runExchange(int64_t index, const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                                 ExtentBindings& bindings, std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  Communicator& comm = *comm_;
  const int64_t rank = program_->rank();
  const int64_t n = static_cast<int64_t>(c.team.size());
  const int64_t me = Communicator::indexIn(c.team, rank);
  const bool solo = n == 1;
  const char* op = c.type == CommunicationType::Combine ? "all_to_all_combine" : "all_to_all_dispatch";
  TransferBytes& bytes = exchange_bytes_[index];
  const at::Tensor counts_value = values.at(c.counts);
  const bool reads_counts = c.type == CommunicationType::ExpertCounts || !solo;
  const std::vector<int64_t> counts = reads_counts ? hostLongs(counts_value) : std::vector<int64_t>{};
  const int64_t e = static_cast<int64_t>(counts.size()) / n;

  if (c.type == CommunicationType::ExpertCounts) {
    const int64_t rows = values.at(c.rows).size(0);
    bool nonnegative = std::all_of(counts.begin(), counts.end(), [](int64_t k) { return k >= 0; });
    const bool ok = nonnegative && sum(counts) == rows;
    const std::string mine = ok ? std::string()
                                : mf::str(" (rank ", rank, ": ", c.counts->label(), " = ", listText(counts), ", ",
                                          nonnegative ? "sum " + std::to_string(sum(counts)) : std::string("negative"),
                                          ", for ", rows, " rows of ", c.rows->label(), ")");
    auto check = [op, mine](const std::vector<int64_t>& bad) {
      MF_USER_CHECK(bad.empty(), op, ": the expert counts of rank(s) ", listText(bad),
                    " do not cover their token rows (every count must be >= 0 and they must sum to the rows)", mine);
    };
    if (solo) {
      // One device: its own counts are all there is to agree on, read above; no second read back.
      check(ok ? std::vector<int64_t>{} : std::vector<int64_t>{rank});
      at::Tensor own = counts_value.reshape({1, e}).to(at::kLong);
      bytes = TransferBytes{};
      pending_finish_[c.output] = [own] { return own; };
      return;
    }
    at::Tensor send = at::empty({n, e + 1}, at::TensorOptions().dtype(at::kLong));
    send.narrow(1, 0, e).copy_(at::tensor(counts, at::kLong).view({n, e}));
    send.select(1, e).fill_(ok ? 1 : 0);
    send = send.to(counts_value.device());
    at::Tensor recv = at::empty_like(send);
    works.push_back(comm.allToAll(c.team, recv, send));
    bytes.sent = bytes.received = (n - 1) * (e + 1) * static_cast<int64_t>(sizeof(int64_t));
    std::vector<int64_t> team = c.team;
    pending_finish_[c.output] = [recv, send, e, team, check] {
      std::vector<int64_t> flags = hostLongs(recv.select(1, e));
      std::vector<int64_t> bad;
      for (size_t j = 0; j < flags.size(); ++j) {
        if (flags[j] != 1) bad.push_back(team[j]);
      }
      check(bad);
      return recv.narrow(1, 0, e).contiguous();
    };
    return;
  }

  if (solo) {
    // One device: every row stays, already grouped by expert (the only source). No copy, no read
    // of the counts; ExpertCounts checked them.
    at::Tensor x = values.at(c.input);
    if (c.type == CommunicationType::Dispatch) {
      bindings[c.output->fusion()->canonicalSymbol(c.output->logicalNoReductions()[0]->extent().symbol)] = x.size(0);
    }
    bytes = TransferBytes{};
    pending_finish_[c.output] = [x] { return x; };
    return;
  }
  const std::vector<int64_t> recv_counts = hostLongs(values.at(c.recv_counts));  // [n, e], source-major
  std::vector<int64_t> per_member(n), per_source(n);
  for (int64_t j = 0; j < n; ++j) {
    per_member[j] = sum(counts, j * e, (j + 1) * e);
    per_source[j] = sum(recv_counts, j * e, (j + 1) * e);
  }
  at::Tensor x = values.at(c.input).contiguous();
  int64_t row_bytes = x.element_size();  // from the shape: a rank may hold no rows
  for (int64_t a = 1; a < x.dim(); ++a) row_bytes *= x.size(a);
  const bool dispatch = c.type == CommunicationType::Dispatch;
  // Dispatch sends per_member rows and receives per_source; the combine the other way round.
  const std::vector<int64_t>& send_rows = dispatch ? per_member : per_source;
  const std::vector<int64_t>& recv_rows = dispatch ? per_source : per_member;
  if (!dispatch) {
    const int64_t received = sum(per_source);
    MF_USER_CHECK(x.size(0) == received, op, ": ", c.input->label(), " has ", x.size(0), " rows on rank ", rank,
                  "; expected the ", received, " rows all_to_all_dispatch received");
    if (n > 1 && e > 1) x = x.index_select(0, regroupIndex(recv_counts, n, e, /*expert_major=*/false, x.device()));
  }
  at::Tensor out = rowsLike(x, sum(recv_rows));
  works.push_back(comm.allToAllV(c.team, out, x, recv_rows, send_rows));
  bytes.sent = (sum(send_rows) - send_rows[me]) * row_bytes;
  bytes.received = (sum(recv_rows) - recv_rows[me]) * row_bytes;
  if (dispatch) {
    bindings[c.output->fusion()->canonicalSymbol(c.output->logicalNoReductions()[0]->extent().symbol)] = out.size(0);
    if (n > 1 && e > 1) {
      at::Tensor index = regroupIndex(recv_counts, n, e, /*expert_major=*/true, out.device());
      pending_finish_[c.output] = [out, index, x] { return out.index_select(0, index); };
      return;
    }
  }
  pending_finish_[c.output] = [out, x] { return out; };  // x: the send buffer lives until the wait
}

}  // namespace mf
