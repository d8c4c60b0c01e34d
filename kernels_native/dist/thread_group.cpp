// The threads backend of dist/collective.h: R ranks that are threads of one process.
//
// Every collective is two rendezvous around one pass over the ranks' memory:
//   1. each rank publishes its call (kind, tensors, op, root, owners) and waits for the others;
//   2. every rank checks every rank's call against rank 0's (the same check on all ranks, so
//      they all pass or all fail: a mismatch never leaves a rank waiting), then does its share
//      of the data movement, reading the other ranks' tensors in place;
//   3. the second rendezvous: nobody returns, or publishes its next call, while another rank
//      may still read its tensors.
// Shares never overlap: in an all-reduce rank r owns elements [r T / R, (r+1) T / R) of the
// bucket (T elements in all) and writes the reduced values into every rank's tensors there;
// in a reduce-scatter or an owner reduce each rank writes only its own output. A reduced
// element is ((x_0 + x_1) + x_2) + ... in f32 whichever rank computes it: bit-identical ranks.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "dist/call_check.h"

namespace surogate::dist {

namespace {

// One rank's arguments to the current collective. reduce_scatter / all_gather: bufs = {in, out}.
struct Call {
  Kind kind = Kind::kBarrier;
  std::vector<Tensor> bufs;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<int> owners;
};

class Group {
 public:
  explicit Group(int world) : world_(world), calls_(world) {}
  int world() const { return world_; }
  const Call& call(int rank) const { return calls_[rank]; }
  // Rank's call, emptied from its slot after the second rendezvous (no rank reads it then):
  // the tensors' references are dropped by the caller, not under the group's lock.
  Call take(int rank) { return std::move(calls_[rank]); }

  // Publish `call` as rank's and wait until every rank has published its own.
  Status arrive(int rank, Call call) { return rendezvous(rank, &call); }
  // Wait until every rank is done with the others' tensors.
  Status depart(int rank) { return rendezvous(rank, nullptr); }

  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_) why_ = why;
      aborted_ = true;
    }
    cv_.notify_all();
  }

 private:
  Status aborted_status() const {
    return SG_ERROR(StatusCode::kInternal, str_cat("collective aborted: ", why_),
                    "another rank of the data-parallel group failed; its error is the one to read");
  }

  Status rendezvous(int rank, Call* publish) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return aborted_status();
    if (publish != nullptr) calls_[rank] = std::move(*publish);
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::OK();
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    return generation_ != gen ? Status::OK() : aborted_status();
  }

  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
  std::vector<Call> calls_;
};

// The same verdict on every rank: every call against rank 0's, then each call's own rules.
Status validate(const Group& g) {
  std::vector<CallDesc> calls;
  for (int r = 0; r < g.world(); ++r) {
    const Call& c = g.call(r);
    calls.push_back(describe_call(c.kind, c.bufs, c.op, c.root, c.owners));
  }
  return dist::validate(calls, "threads");
}

// ---- the data movement ----------------------------------------------------------------------

constexpr int64_t kBlock = 2048;  // elements reduced together (f32 on the stack)

// dst[j] = reduce over k of src_k[j] for j < n, the sum in rank order in f32.
template <typename T>
void reduce_block(const std::vector<const T*>& src, int64_t n, ReduceOp op, float* acc) {
  const T* s0 = src[0];
  for (int64_t j = 0; j < n; ++j) acc[j] = load(s0[j]);
  for (size_t k = 1; k < src.size(); ++k) {
    const T* s = src[k];
    for (int64_t j = 0; j < n; ++j) acc[j] += load(s[j]);
  }
  if (op == ReduceOp::kMean) {
    const float R = static_cast<float>(src.size());
    for (int64_t j = 0; j < n; ++j) acc[j] /= R;
  }
}

template <typename T>
void store_block(const float* acc, int64_t n, T* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = store<T>(acc[j]);
}

// Elements [lo, hi) of tensor `i`: reduced over the ranks' tensors `srcs` (element offset
// src_off), written into each tensor of `dsts` (element offset dst_off).
template <typename T>
void reduce_range(const std::vector<const Tensor*>& srcs, int64_t src_off, const std::vector<const Tensor*>& dsts,
                  int64_t dst_off, int64_t n, ReduceOp op) {
  float acc[kBlock];
  std::vector<const T*> src(srcs.size());
  for (int64_t a = 0; a < n; a += kBlock) {
    const int64_t m = std::min(kBlock, n - a);
    for (size_t k = 0; k < srcs.size(); ++k) src[k] = srcs[k]->ptr<T>() + src_off + a;
    reduce_block<T>(src, m, op, acc);
    for (const Tensor* d : dsts) store_block<T>(acc, m, d->ptr<T>() + dst_off + a);
  }
}

void reduce_any(DType dt, const std::vector<const Tensor*>& srcs, int64_t src_off,
                const std::vector<const Tensor*>& dsts, int64_t dst_off, int64_t n, ReduceOp op) {
  if (n <= 0) return;
  switch (dt) {
    case DType::kF32: reduce_range<float>(srcs, src_off, dsts, dst_off, n, op); break;
    case DType::kBF16: reduce_range<bf16_t>(srcs, src_off, dsts, dst_off, n, op); break;
    case DType::kF16: reduce_range<f16_t>(srcs, src_off, dsts, dst_off, n, op); break;
    default: break;  // validate() refused it
  }
}

void copy_elems(const Tensor& src, int64_t src_off, const Tensor& dst, int64_t dst_off, int64_t n) {
  const size_t es = dtype_size(src.dtype);
  const char* s = static_cast<const char*>(src.data) + src_off * static_cast<int64_t>(es);
  char* d = static_cast<char*>(dst.data) + dst_off * static_cast<int64_t>(es);
  if (n > 0 && s != d) std::memcpy(d, s, static_cast<size_t>(n) * es);
}

void do_all_reduce(const Group& g, int rank) {
  const Call& me = g.call(rank);
  const int R = g.world();
  int64_t total = 0;
  for (const Tensor& t : me.bufs) total += t.numel();
  const int64_t lo = total * rank / R, hi = total * (rank + 1) / R;  // this rank's share of the bucket
  int64_t base = 0;
  std::vector<const Tensor*> ts(R);
  for (size_t i = 0; i < me.bufs.size(); base += me.bufs[i].numel(), ++i) {
    const int64_t a = std::max(lo, base), b = std::min(hi, base + me.bufs[i].numel());
    if (a >= b) continue;
    for (int k = 0; k < R; ++k) ts[k] = &g.call(k).bufs[i];
    reduce_any(me.bufs[i].dtype, ts, a - base, ts, a - base, b - a, me.op);
  }
}

void do_reduce_scatter(const Group& g, int rank) {
  const int R = g.world();
  const Tensor& out = g.call(rank).bufs[1];
  std::vector<const Tensor*> ins(R);
  for (int k = 0; k < R; ++k) ins[k] = &g.call(k).bufs[0];
  reduce_any(out.dtype, ins, rank * out.numel(), {&out}, 0, out.numel(), g.call(rank).op);
}

void do_all_gather(const Group& g, int rank) {
  const Tensor& out = g.call(rank).bufs[1];
  for (int k = 0; k < g.world(); ++k) {
    const Tensor& in = g.call(k).bufs[0];
    copy_elems(in, 0, out, k * in.numel(), in.numel());
  }
}

void do_broadcast(const Group& g, int rank) {
  const Call& me = g.call(rank);
  if (rank == me.root) return;
  for (size_t i = 0; i < me.bufs.size(); ++i) copy_elems(g.call(me.root).bufs[i], 0, me.bufs[i], 0, me.bufs[i].numel());
}

void do_reduce_to_owners(const Group& g, int rank) {
  const Call& me = g.call(rank);
  std::vector<const Tensor*> ts(g.world());
  for (size_t i = 0; i < me.bufs.size(); ++i) {
    if (me.owners[i] != rank) continue;
    for (int k = 0; k < g.world(); ++k) ts[k] = &g.call(k).bufs[i];
    reduce_any(me.bufs[i].dtype, ts, 0, {&me.bufs[i]}, 0, me.bufs[i].numel(), me.op);
  }
}

void do_gather_from_owners(const Group& g, int rank) {
  const Call& me = g.call(rank);
  for (size_t i = 0; i < me.bufs.size(); ++i) {
    if (me.owners[i] != rank) copy_elems(g.call(me.owners[i]).bufs[i], 0, me.bufs[i], 0, me.bufs[i].numel());
  }
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world(); }
  const char* backend() const override { return "threads"; }

  Status all_reduce(const std::vector<Tensor>& bufs, ReduceOp op) override {
    return run(Call{Kind::kAllReduce, bufs, op, 0, {}}, do_all_reduce);
  }
  Status reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    return run(Call{Kind::kReduceScatter, {in, out}, op, 0, {}}, do_reduce_scatter);
  }
  Status all_gather(const Tensor& in, const Tensor& out) override {
    return run(Call{Kind::kAllGather, {in, out}, ReduceOp::kSum, 0, {}}, do_all_gather);
  }
  Status broadcast(const std::vector<Tensor>& bufs, int root) override {
    return run(Call{Kind::kBroadcast, bufs, ReduceOp::kSum, root, {}}, do_broadcast);
  }
  Status reduce_to_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners, ReduceOp op) override {
    return run(Call{Kind::kReduceToOwners, bufs, op, 0, owners}, do_reduce_to_owners);
  }
  Status gather_from_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners) override {
    return run(Call{Kind::kGatherFromOwners, bufs, ReduceOp::kSum, 0, owners}, do_gather_from_owners);
  }
  Status barrier() override { return run(Call{}, nullptr); }
  void abort(const std::string& why) override { group_->abort(why); }

 private:
  Status run(Call call, void (*move)(const Group&, int)) {
    SG_RETURN_IF_ERROR(group_->arrive(rank_, std::move(call)));
    Status st = validate(*group_);
    if (st.ok() && move != nullptr) move(*group_, rank_);
    Status left = group_->depart(rank_);  // also on a failed check: the others may still read our call
    if (left.ok()) {
      Call done = group_->take(rank_);
    }
    return st.ok() ? left : st;
  }

  std::shared_ptr<Group> group_;
  const int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_thread_group(int world) {
  auto group = std::make_shared<Group>(std::max(world, 1));
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < group->world(); ++r) out.push_back(std::make_shared<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace surogate::dist
