#include "serve/draft_proposer.h"

#include <algorithm>
#include <cassert>

#include "runtime/op_checks_sample.h"

namespace surogate::serve {

namespace {

// The token at position p of seq: its own, or a draft token past its end.
int32_t token_at(const Sequence& seq, int p) {
  const int n = seq.num_tokens();
  return p < n ? seq.token_ids[p] : seq.draft_ids[p - n];
}

// The lowest id among the largest logits of a row (the engine's greedy rule).
int32_t argmax(const float* row, int64_t V) {
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v) {
    if (row[v] > row[best]) best = static_cast<int32_t>(v);
  }
  return best;
}

}  // namespace

DraftProposer::DraftProposer(std::shared_ptr<ModelRunner> runner, int block_size, int max_num_batched_tokens)
    : runner_(std::move(runner)), block_size_(block_size), max_tokens_(std::max(1, max_num_batched_tokens)) {}

Status DraftProposer::run(const std::vector<Span>& spans, std::vector<int32_t>* argmax_out) {
  StepInput& in = in_;
  in = StepInput();
  in.block_size = block_size_;
  in.num_seqs = static_cast<int32_t>(spans.size());
  for (const Span& s : spans) {
    const int blocks = (s.start + s.len + block_size_ - 1) / block_size_;
    in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, blocks);
  }
  in.block_tables.assign(static_cast<size_t>(in.num_seqs) * in.max_blocks_per_seq, -1);
  in.cu_q.push_back(0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const Sequence& seq = *s.seq;
    const int end = s.start + s.len;
    assert(static_cast<int>(seq.block_table.size()) * block_size_ >= end);
    for (int p = s.start; p < end; ++p) {
      in.token_ids.push_back(token_at(seq, p));
      in.positions.push_back(p);  // the draft is a text model: plain positions
      in.slot_mapping.push_back(seq.block_table[p / block_size_] * block_size_ + p % block_size_);
    }
    in.cu_q.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.context_lens.push_back(end);
    std::copy_n(seq.block_table.begin(), (end + block_size_ - 1) / block_size_,
                in.block_tables.begin() + static_cast<ptrdiff_t>(i) * in.max_blocks_per_seq);
    in.adapter_ids.push_back(-1);
    in.state_slots.push_back(seq.state_slot);
    in.request_ids.push_back(static_cast<int64_t>(seq.id));
    in.max_query_len = std::max(in.max_query_len, s.len);
    in.max_context_len = std::max(in.max_context_len, end);
    if (s.row) {
      in.logits_rows.push_back(in.cu_q.back() - 1);
      in.need_logits.push_back(runner_->samples_on_device() ? 0 : 1);
    }
  }
  in.num_tokens = static_cast<int32_t>(in.token_ids.size());
  // Temperature 0 in every row: the device's token is the argmax.
  if (runner_->samples_on_device()) in.sample_params.assign(in.logits_rows.size() * kSampleParamCols, 0.0f);

  out_ = StepOutput();
  SG_RETURN_IF_ERROR(runner_->run(in, &out_));
  ++num_runs_;
  const int64_t R = in.num_logits_rows(), V = runner_->vocab_size();
  if (static_cast<int64_t>(out_.tokens.size()) == R) {
    for (int64_t r = 0; r < R; ++r) {
      const int32_t t = out_.tokens[r];
      SG_CHECK(t >= 0 && t < V, StatusCode::kInternal, str_cat("the draft model gave token ", t),
               "check the draft model's weights: NaN logits usually mean an overflow");
      argmax_out->push_back(t);
    }
    return Status::OK();
  }
  const Tensor& t = out_.logits;
  SG_CHECK(t.device.is_cpu() && t.dtype == DType::kF32 && t.ndim == 2 && t.shape[0] == R && t.shape[1] == V &&
               (R == 0 || (t.data != nullptr && t.strides[1] == 1)),
           StatusCode::kShapeMismatch,
           str_cat("the draft model runner returned logits ", t.describe(), "; expected float32[", R, ", ", V, "] on cpu"),
           "return one row per StepInput.logits_rows entry, or one token per row");
  for (int64_t r = 0; r < R; ++r) argmax_out->push_back(argmax(t.ptr<float>() + r * t.strides[0], V));
  return Status::OK();
}

Status DraftProposer::propose(const std::vector<Sequence*>& seqs, const std::vector<int>& want, BlockManager* bm,
                              int num_running) {
  assert(seqs.size() == want.size());
  const int Vd = runner_->vocab_size();
  // Who drafts how many: the blocks for positions up to num_tokens + k - 2 are taken now, while
  // every running sequence keeps a free block for its next token.
  std::vector<Sequence*> active;
  std::vector<int> ks;
  int spare = bm->num_free_blocks() - num_running;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    seq.draft_ids.clear();
    int k = want[i];
    if (k <= 0) continue;
    const int n = seq.num_tokens();
    seq.draft_computed = std::min(seq.draft_computed, n - 1);
    const bool foreign = std::any_of(seq.token_ids.begin() + seq.draft_computed, seq.token_ids.end(),
                                     [Vd](int32_t t) { return t >= Vd; });
    if (foreign) continue;  // a token the draft cannot embed (a larger target vocabulary's)
    const int have = static_cast<int>(seq.block_table.size());
    while (k > 0 && bm->blocks_for(n + k - 1) - have > std::max(spare, 0)) --k;
    if (k == 0) continue;
    spare -= std::max(0, bm->blocks_for(n + k - 1) - have);
    bm->may_append(seq, k - 1);
    active.push_back(&seq);
    ks.push_back(k);
  }
  if (active.empty()) return Status::OK();

  // Catch-up, in runs of at most max_tokens_ tokens; a span may be cut across runs.
  std::vector<int> next(active.size());
  for (size_t i = 0; i < active.size(); ++i) next[i] = active[i]->draft_computed;
  std::vector<int32_t> first;  // draft token 1 of each active sequence, in order
  size_t i = 0;
  while (i < active.size()) {
    std::vector<Span> spans;
    std::vector<size_t> rows;  // which active sequence each logits row belongs to
    int budget = max_tokens_;
    while (i < active.size() && budget > 0) {
      Sequence& seq = *active[i];
      const int n = seq.num_tokens();
      const int len = std::min(n - next[i], budget);
      const bool done = next[i] + len == n;
      spans.push_back({&seq, next[i], len, done});
      if (done) rows.push_back(i);
      next[i] += len;
      budget -= len;
      if (done) ++i;
    }
    std::vector<int32_t> got;
    SG_RETURN_IF_ERROR(run(spans, &got));
    assert(got.size() == rows.size());
    first.insert(first.end(), got.begin(), got.end());
  }
  for (size_t a = 0; a < active.size(); ++a) {
    active[a]->draft_computed = active[a]->num_tokens();
    active[a]->draft_ids.push_back(first[a]);
  }

  // Decode runs: draft token j (at position n + j - 1) gives token j + 1.
  for (int j = 1;; ++j) {
    std::vector<Span> spans;
    std::vector<Sequence*> who;
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence& seq = *active[a];
      if (static_cast<int>(seq.draft_ids.size()) != j || j >= ks[a]) continue;
      spans.push_back({&seq, seq.num_tokens() + j - 1, 1, true});
      who.push_back(&seq);
    }
    if (spans.empty()) break;
    std::vector<int32_t> got;
    SG_RETURN_IF_ERROR(run(spans, &got));
    for (size_t w = 0; w < who.size(); ++w) {
      who[w]->draft_computed = who[w]->num_tokens() + j;
      who[w]->draft_ids.push_back(got[w]);
    }
  }
  return Status::OK();
}

}  // namespace surogate::serve
