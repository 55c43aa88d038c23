#include "runtime/agreement.h"

#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <map>
#include <optional>

#include "ir/fusion.h"
#include "multidevice/communicator.h"
#include "support/error.h"
#include "support/options.h"

namespace mf {
namespace {

constexpr int64_t kSymbolSlots = kCallHeaderLength - kHeaderSlots;

std::string rankList(const std::vector<int64_t>& ranks) {
  std::string text;
  for (int64_t r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// "rank 0: 6, rank 1: 8" for the ranks whose value is not `skip`.
std::string perRank(const std::vector<std::string>& values) {
  std::string text;
  for (size_t r = 0; r < values.size(); ++r) {
    if (values[r].empty()) continue;
    text += (text.empty() ? "" : ", ") + mf::str("rank ", r, ": ", values[r]);
  }
  return text;
}

std::string deviceName(int64_t type) {
  return type < 0 ? "none" : c10::DeviceTypeName(static_cast<c10::DeviceType>(type), /*lower_case=*/true);
}

// The symbolic axes of the inputs, in input and axis order, each with where it first appears.
void inputSymbols(const Fusion& f, std::vector<std::string>& symbols, std::vector<std::string>& where) {
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const Val* v = f.inputs()[i];
    if (!v->isTensor()) continue;
    auto ids = static_cast<const TensorView*>(v)->logicalNoReductions();
    for (size_t a = 0; a < ids.size(); ++a) {
      if (ids[a]->extent().isConst()) continue;
      std::string s = f.canonicalSymbol(ids[a]->extent().symbol);
      if (std::find(symbols.begin(), symbols.end(), s) != symbols.end()) continue;
      symbols.push_back(s);
      where.push_back(mf::str("input ", i, " axis ", a));
    }
  }
  // Integer scalar inputs may size tensors (slice bounds, reshape sizes): they must agree too.
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const Val* v = f.inputs()[i];
    if (v->isTensor() || !isIntegral(v->dtype())) continue;
    symbols.push_back(v->toString());
    where.push_back(mf::str("input ", i));
  }
}

// Strict mode: per input, [kind, dtype, dim, local sizes...] (kind 1: a tensor of this rank's
// mesh, 0: a tensor outside it, -1: a scalar); as many sizes as the definition has axes.
std::vector<int64_t> describeInputs(const Fusion& f, const std::vector<RuntimeValue>& inputs, int64_t rank) {
  std::vector<int64_t> d;
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const Val* v = f.inputs()[i];
    size_t ndim = v->isTensor() ? static_cast<const TensorView*>(v)->logicalNoReductions().size() : 0;
    const RuntimeValue* rv = i < inputs.size() ? &inputs[i] : nullptr;
    auto* tv = v->isTensor() ? static_cast<const TensorView*>(v) : nullptr;
    bool mine = tv && rv && rv->is_tensor && (!tv->hasMesh() || tv->mesh().has(rank));
    d.push_back(mine ? 1 : tv ? 0 : -1);
    d.push_back(mine ? static_cast<int64_t>(rv->tensor.scalar_type()) : 0);
    d.push_back(mine ? rv->tensor.dim() : 0);
    for (size_t a = 0; a < ndim; ++a) d.push_back(mine && static_cast<int64_t>(a) < rv->tensor.dim() ? rv->tensor.size(a) : -1);
  }
  return d;
}

void compareDetail(const Fusion& f, const std::vector<int64_t>& all, int64_t size) {
  const int64_t n = static_cast<int64_t>(all.size()) / size;
  int64_t offset = 0;
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const Val* v = f.inputs()[i];
    int64_t ndim = v->isTensor() ? static_cast<int64_t>(static_cast<const TensorView*>(v)->logicalNoReductions().size()) : 0;
    auto field = [&](int64_t r, int64_t k) { return all[r * n + offset + k]; };
    // Fields: 1 dtype, 2 dim, 3.. sizes. Compared among the ranks that hold this input.
    for (int64_t k = 1; k < 3 + ndim; ++k) {
      std::vector<std::string> values(size);
      int64_t first = -1;
      bool differ = false;
      for (int64_t r = 0; r < size; ++r) {
        if (field(r, 0) != 1) continue;
        int64_t x = field(r, k);
        values[r] = k == 1 ? std::string(c10::toString(static_cast<c10::ScalarType>(x))) : std::to_string(x);
        if (first < 0) first = r;
        else if (x != field(first, k)) differ = true;
      }
      if (!differ) continue;
      std::string what = k == 1 ? "dtype" : k == 2 ? "number of dimensions" : mf::str("axis ", k - 3, " local extent");
      MF_THROW_USER("execute: the ranks pass different inputs (MESHFUSER_DISTRIBUTED_DEBUG=DETAIL): input ", i, " (",
                    v->toString(), ") ", what, ": ", perRank(values),
                    "; every rank of a tensor's mesh must pass a shard of the same global shape");
    }
    offset += 3 + ndim;
  }
}

std::string hex(int64_t v) {
  char text[24];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

// "call 3 of definition 1a2b... (thread 'MainThread')" for rank r's header.
std::string callText(const std::vector<int64_t>& all, int64_t r, bool thread) {
  const int64_t* h = all.data() + r * kCallHeaderLength;
  if (h[kMagicSlot] == kFarewellMagic) {
    return mf::str("finished (shut meshfuser down) after ", h[kCall], " call(s) in all");
  }
  if (h[kMagicSlot] == kFailedMagic) return "the end of a call that failed there before posting any data";
  if (h[kMagicSlot] != kCallMagic) return "a message that is not a meshfuser call header";
  return mf::str("call ", h[kCall], " of definition ", hex(h[kFingerprint]).substr(0, 12),
                 thread ? mf::str(" from thread '", threadTagName(h[kThread]), "'") : std::string());
}

// Every rank must be in the same agreement round, on the same call of the same definition, from
// the same thread: otherwise the ranks are out of step, and every rank raises naming the calls.
void checkSameCall(Communicator& comm, const std::vector<int64_t>& all, int64_t size, uint64_t fingerprint) {
  auto at = [&](int64_t r, int64_t slot) { return all[r * kCallHeaderLength + slot]; };
  bool rounds_differ = false, programs_differ = false, calls_differ = false, threads_differ = false;
  std::vector<int64_t> others;
  for (int64_t r = 0; r < size; ++r) {
    bool call = at(r, kMagicSlot) == kCallMagic;
    // Compared with rank 0's header (every rank names the same ranks).
    if (!call || at(r, kRound) != at(0, kRound)) rounds_differ = true;
    else if (at(r, kFingerprint) != at(0, kFingerprint)) programs_differ = true;
    else if (at(r, kCall) != at(0, kCall)) calls_differ = true;
    else if (at(r, kThread) != at(0, kThread)) threads_differ = true;
    else continue;
    others.push_back(r);
  }
  if (others.empty()) return;
  for (int64_t r = 0; r < size; ++r) {
    if (at(r, kMagicSlot) == kCallMagic) comm.syncCall(static_cast<uint64_t>(at(r, kFingerprint)), at(r, kCall));
  }
  std::vector<std::string> calls(size);
  for (int64_t r = 0; r < size; ++r) calls[r] = callText(all, r, threads_differ);
  std::string per_rank = perRank(calls);
  if (rounds_differ) {
    std::vector<std::string> rounds(size);
    for (int64_t r = 0; r < size; ++r) rounds[r] = std::to_string(at(r, kRound));
    MF_THROW_USER("execute: the ranks are out of step: rank(s) ", rankList(others), " sent a different call than ",
                  "rank 0 (", per_rank, "; agreement round per rank: ", perRank(rounds), "); an earlier call failed on some ranks only, or a rank skipped, added or ended its calls");
  }
  if (programs_differ) {
    MF_THROW_USER("execute: the ranks are out of step: rank(s) ", rankList(others), " compiled a different program ",
                  "(definition or sharding schedule) than rank 0 for this call (", per_rank,
                  "); every rank must execute the same definitions in the same order (a rank that skipped or added ",
                  "an execute shows up here). This rank's program fingerprint is ", fingerprint);
  }
  if (calls_differ) {
    MF_THROW_USER("execute: the ranks are out of step: rank(s) ", rankList(others), " are at another call of this ",
                  "definition than rank 0 (", per_rank, "): a rank skipped or added a call of it, so ",
                  "calls with different numbers would have exchanged data");
  }
  MF_THROW_USER("execute: the ranks run this call from different threads (", per_rank, "); calls from several ",
                "threads are taken one at a time per process, in whatever order the threads come, so the ranks ",
                "would pair one thread's call with another's. Call execute from the same thread on every rank, ",
                "or order the threads' calls the same way on every rank");
}

}  // namespace

namespace {
std::mutex& threadNamesMutex() {
  static std::mutex m;
  return m;
}
std::map<int64_t, std::string>& threadNames() {
  static std::map<int64_t, std::string> names = {{0, "MainThread"}};
  return names;
}
}  // namespace

int64_t& callThreadTag() {
  thread_local int64_t tag = 0;
  return tag;
}

void registerThreadName(int64_t tag, const std::string& name) {
  std::lock_guard<std::mutex> lock(threadNamesMutex());
  threadNames()[tag] = name;
}

std::string threadTagName(int64_t tag) {
  std::lock_guard<std::mutex> lock(threadNamesMutex());
  auto it = threadNames().find(tag);
  return it == threadNames().end() ? "#" + hex(tag).substr(0, 8) : it->second;
}

bool strictAgreement() {
  const std::string v = envString("MESHFUSER_DISTRIBUTED_DEBUG");
  if (v.empty()) return false;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  MF_USER_CHECK(s == "OFF" || s == "INFO" || s == "DETAIL", "MESHFUSER_DISTRIBUTED_DEBUG: unknown value '", v,
                "'; valid values are OFF, INFO (a per-call agreement header, the default) and DETAIL (strict: "
                "every input's dtype and local shape compared on every call, and completion checked)");
  return s == "DETAIL";
}

CallAgreement::CallAgreement(Communicator& comm, const Fusion& f, uint64_t fingerprint,
                             const std::vector<RuntimeValue>& inputs, ExtentBindings& bindings, std::string error,
                             bool strict)
    : comm_(comm), fusion_(f), fingerprint_(fingerprint), error_(std::move(error)), strict_(strict), bindings_(&bindings) {
  inputSymbols(f, symbols_, where_);
  for (const std::string& s : symbols_) {
    auto it = bindings.find(s);
    extents_.push_back(it == bindings.end() ? -1 : it->second);
  }
  int64_t device = -1;
  for (const RuntimeValue& rv : inputs) {
    if (rv.is_tensor && rv.tensor.defined()) device = static_cast<int64_t>(rv.tensor.device().type());
  }
  if (strict) detail_ = describeInputs(f, inputs, comm.rank());
  call_ = comm.nextCall(fingerprint);
  std::vector<int64_t> header(kCallHeaderLength, -1);
  header[kMagicSlot] = kCallMagic;
  header[kRound] = comm.rounds() + 1;
  header[kFingerprint] = static_cast<int64_t>(fingerprint);
  header[kCall] = call_;
  header[kThread] = callThreadTag();
  header[kOk] = error_.empty() ? 1 : 0;
  header[kDevice] = device;
  header[kNumSymbols] = static_cast<int64_t>(symbols_.size());
  header[kDetailLength] = static_cast<int64_t>(detail_.size());
  header[kStrict] = strict ? 1 : 0;
  for (int64_t s = 0; s < std::min<int64_t>(kSymbolSlots, extents_.size()); ++s) header[kHeaderSlots + s] = extents_[s];
  pending_ = comm.postExchange(header, "the per-call agreement");
}

bool CallAgreement::missesExtents() const {
  for (size_t s = 0; s < symbols_.size(); ++s) {
    if (extents_[s] < 0 && symbols_[s][0] != 'S') return true;
  }
  return false;
}

void agreeOnCall(Communicator& comm, const Fusion& f, uint64_t fingerprint, const std::vector<RuntimeValue>& inputs,
                 const ExtentBindings& given, const std::string& error, bool strict) {
  ExtentBindings bindings = given;
  CallAgreement(comm, f, fingerprint, inputs, bindings, error, strict).finish();
}

void CallAgreement::finish() {
  if (finished_) return;
  finished_ = true;
  Communicator& comm = comm_;
  const Fusion& f = fusion_;
  const uint64_t fingerprint = fingerprint_;
  const std::string& error = error_;
  const bool strict = strict_;
  const auto& symbols = symbols_;
  const auto& where = where_;
  const auto& extents = extents_;
  const auto& detail = detail_;
  const int64_t size = comm.size();
  std::vector<int64_t> all = comm.finishExchange(pending_);
  auto at = [&](int64_t r, int64_t slot) { return all[r * kCallHeaderLength + slot]; };

  checkSameCall(comm, all, size, fingerprint);
  std::vector<int64_t> other_mode, failed;
  for (int64_t r = 0; r < size; ++r) {
    if (at(r, kStrict) != at(0, kStrict)) other_mode.push_back(r);
    if (at(r, kOk) == 0) failed.push_back(r);
  }
  MF_USER_CHECK(other_mode.empty(), "execute: MESHFUSER_DISTRIBUTED_DEBUG differs across ranks: rank(s) ",
                rankList(other_mode), (at(0, kStrict) ? " do not" : " do"), " run strict mode (DETAIL) but rank 0",
                (at(0, kStrict) ? " does" : " does not"), "; set it to the same value on every rank");
  if (!failed.empty()) {
    MF_USER_CHECK(error.empty(), "execute: ", error,
                  size > 1 ? mf::str(" (every rank was told: input validation failed on rank(s) ", rankList(failed), ")")
                           : std::string());
    MF_THROW_USER("execute: input validation failed on rank(s) ", rankList(failed), "; see the error raised there (rank ",
                  comm.rank(), " had valid inputs); no data was exchanged");
  }
  {
    std::vector<std::string> devices(size);
    std::map<int64_t, int> kinds;
    for (int64_t r = 0; r < size; ++r) {
      if (at(r, kDevice) < 0) continue;
      devices[r] = deviceName(at(r, kDevice));
      kinds[at(r, kDevice)]++;
    }
    MF_USER_CHECK(kinds.size() <= 1, "execute: the ranks' inputs are on different kinds of device (", perRank(devices),
                  "); every rank must pass CPU tensors, or every rank CUDA tensors");
  }
  // Symbolic axes: global extents must agree among the ranks that bound them.
  std::vector<int64_t> extra;
  if (static_cast<int64_t>(symbols.size()) > kSymbolSlots) {
    extra.assign(extents.begin() + kSymbolSlots, extents.end());
    extra = comm.exchange(extra, "the per-call agreement (symbolic extents)");
  }
  const int64_t n_extra = static_cast<int64_t>(symbols.size()) - kSymbolSlots;
  for (size_t s = 0; s < symbols.size(); ++s) {
    std::vector<std::string> values(size);
    // An extent of -1 is a symbol this rank did not bind; an integer scalar input is bound on every
    // rank (validation passed everywhere, or the call failed above) and may be negative (a slice
    // bound counting from the end), so each of its values counts.
    const bool scalar = symbols[s][0] == 'S';
    std::optional<int64_t> first;
    bool differ = false;
    for (int64_t r = 0; r < size; ++r) {
      int64_t x = static_cast<int64_t>(s) < kSymbolSlots ? at(r, kHeaderSlots + s) : extra[r * n_extra + (s - kSymbolSlots)];
      if (x < 0 && !scalar) continue;
      values[r] = std::to_string(x);
      if (!first) first = x;
      else if (x != *first) differ = true;
    }
    MF_USER_CHECK(!differ || !scalar, "execute: the ranks pass different values for the integer scalar ",
                  symbols[s], " (", where[s], "): ", perRank(values), "; every rank must pass the same scalars");
    MF_USER_CHECK(!differ, "execute: the ranks disagree on the global extent of symbolic axis ", symbols[s], " (",
                  where[s], "; global = local extent x shards): ", perRank(values),
                  "; every rank must pass shards of the same global shape (uneven shards are not supported)");
    if (extents[s] < 0 && first && !scalar) (*bindings_)[symbols[s]] = *first;
  }
  if (strict) {
    for (int64_t r = 0; r < size; ++r) {
      MF_CHECK(at(r, kDetailLength) == at(0, kDetailLength), "strict agreement: detail lengths differ across ranks");
    }
    compareDetail(f, comm.exchange(detail, "the strict per-call agreement"), size);
  }
  agreed_ = true;
}

std::string farewell(Communicator& comm) {
  if (!comm.initialized() || comm.size() == 1) return "";
  std::vector<int64_t> header(kCallHeaderLength, -1);
  header[kMagicSlot] = kFarewellMagic;
  header[kRound] = comm.rounds() + 1;
  header[kCall] = comm.totalCalls();
  std::string text;
  for (const auto& [rank, message] : comm.leave(header)) {
    if (!message.empty() && message[kMagicSlot] == kFarewellMagic) continue;  // it left too
    std::vector<int64_t> all(kCallHeaderLength * (rank + 1), 0);
    if (message.size() == static_cast<size_t>(kCallHeaderLength)) {
      std::copy(message.begin(), message.end(), all.begin() + rank * kCallHeaderLength);
    }
    text += mf::str(text.empty() ? "" : "; ", "rank ", rank, " is in ",
                    message.size() == static_cast<size_t>(kCallHeaderLength) ? callText(all, rank, false)
                                                                             : std::string("a control round"),
                    ", which rank ", comm.rank(), " never joins");
  }
  if (text.empty()) return "";
  return mf::str("meshfuser: error: the ranks were out of step: rank ", comm.rank(), " shuts down after ",
                 comm.totalCalls(), " call(s) in all, but ", text, ". A rank skipped or added a call, so calls ",
                 "since then may have exchanged data from different calls; their results are not to be trusted.");
}

void settleFailure(Communicator& comm, uint64_t fingerprint) {
  std::vector<int64_t> mine(kCallHeaderLength, -1);
  mine[kMagicSlot] = kFailedMagic;
  mine[kRound] = comm.rounds() + 1;
  mine[kFingerprint] = static_cast<int64_t>(fingerprint);
  std::vector<int64_t> all;
  try {
    all = comm.exchange(mine, "settling a call that failed before posting");
  } catch (const std::exception&) {
    return;  // the exchange failed: the Communicator is marked unusable already
  }
  for (int64_t r = 0; r < comm.size(); ++r) {
    const int64_t* h = all.data() + r * kCallHeaderLength;
    if (h[kMagicSlot] == kFailedMagic && h[kFingerprint] == static_cast<int64_t>(fingerprint)) continue;
    comm.markBroken(mf::str("the call failed on rank ", comm.rank(), " before it posted any data, but rank ", r,
                            " did not fail it the same way"));
    return;
  }
}

void agreeOnCompletion(Communicator& comm, uint64_t fingerprint, bool ok) {
  std::vector<int64_t> mine = {kCallMagic, comm.rounds() + 1, static_cast<int64_t>(fingerprint), ok ? 1 : 0};
  std::vector<int64_t> all = comm.exchange(mine, "the strict completion check");
  std::vector<int64_t> failed;
  for (int64_t r = 0; r < comm.size(); ++r) {
    if (all[r * 4 + 3] != 1) failed.push_back(r);
  }
  if (ok) {
    MF_USER_CHECK(failed.empty(), "execute: the call failed on rank(s) ", rankList(failed),
                  " after the ranks agreed on it (see the error raised there); this rank completed it, but its "
                  "results may depend on data the failed rank(s) did not send");
  }
}

}  // namespace mf
