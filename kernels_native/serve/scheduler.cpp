#include "serve/scheduler.h"

#include <algorithm>
#include <cassert>

#include "runtime/op_checks_sample.h"
#include "serve/sampler.h"

namespace surogate::serve {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager* block_manager)
    : config_(config), block_manager_(block_manager) {
  assert(config_.max_num_seqs > 0 && config_.max_num_batched_tokens > 0 && config_.max_model_len > 0);
  for (int32_t s = config_.max_num_seqs - 1; s >= 0; --s) free_state_slots_.push_back(s);
}

void Scheduler::add(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

int Scheduler::chunk_len(const Sequence& seq, int budget) {
  const int start = seq.num_computed_tokens;
  const int len = std::min(seq.num_uncomputed_tokens(), budget);
  const EmbedSpan* span = seq.bidirectional_span_across(start + len);
  if (span == nullptr) return len;
  return span->start > start ? span->start - start : span->end() - start;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int budget = config_.max_num_batched_tokens;
  BlockManager& bm = *block_manager_;

  // 1. Decodes. Victims come from the back of running_, never from the part already scheduled.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (!seq->is_decoding()) {
      ++i;
      continue;
    }
    // Drafts ride along only on budget and blocks left over: they never preempt anyone.
    int k = std::min(static_cast<int>(seq->draft_ids.size()), budget - 1);
    if (k > 0 && !bm.can_append(*seq, k)) k = 0;
    seq->draft_ids.resize(k);
    bool self_preempted = false;
    while (!bm.can_append(*seq, k)) {
      Sequence* victim = running_.back();
      running_.pop_back();
      preempt(victim);
      ++plan.num_preempted;
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // seq was the last one: nothing after it is left
    bm.may_append(*seq, k);
    ScheduledSeq ss{seq, seq->num_computed_tokens, 1 + k};
    ss.num_draft = k;
    plan.seqs.push_back(ss);
    budget -= 1 + k;
    ++i;
  }

  // 2. Prefill chunks of sequences admitted earlier.
  for (Sequence* seq : running_) {
    if (budget == 0) break;
    if (seq->is_decoding()) continue;
    const int len = chunk_len(*seq, budget);
    plan.seqs.push_back({seq, seq->num_computed_tokens, len});
    budget = std::max(0, budget - len);
  }

  // 3. Admissions.
  const int capacity = bm.num_blocks() * bm.block_size();
  while (!waiting_.empty() && plan.num_preempted == 0 && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (seq->num_tokens() > config_.max_model_len || seq->num_tokens() > capacity) {
      waiting_.pop_front();
      const bool by_len = config_.max_model_len < capacity;
      seq->status = SequenceStatus::kFinished;
      seq->finish_reason = FinishReason::kError;
      seq->finish_message =
          by_len ? str_cat("prompt of ", seq->num_tokens(), " tokens is longer than max_model_len (",
                           config_.max_model_len, " tokens)")
                 : str_cat("prompt of ", seq->num_tokens(), " tokens can never fit in the KV cache (",
                           bm.num_blocks(), " blocks of ", bm.block_size(), " tokens = ", capacity, " tokens)");
      plan.rejected.push_back(seq);
      continue;
    }
    if (!bm.can_allocate(*seq)) break;  // FIFO: later requests do not overtake it
    waiting_.pop_front();
    bm.allocate(*seq);
    assert(!free_state_slots_.empty());
    seq->state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    const int len = chunk_len(*seq, budget);
    plan.seqs.push_back({seq, seq->num_computed_tokens, len});
    budget = std::max(0, budget - len);
  }

  if (!plan.empty()) build_input(plan);
  return plan;
}

void Scheduler::build_input(StepPlan& plan) const {
  const int bs = block_manager_->block_size();
  StepInput& in = plan.input;
  in.block_size = bs;
  bool bidirectional = false;  // a bidirectional span's tokens run in this step: kv_limit is needed
  std::vector<int32_t> seq_pos;  // each token's position in its sequence (positions: its rope position)
  in.num_seqs = static_cast<int32_t>(plan.seqs.size());
  in.cu_q.push_back(0);
  for (const ScheduledSeq& ss : plan.seqs) {
    in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, block_manager_->blocks_for(ss.start + ss.len));
  }
  in.block_tables.assign(static_cast<size_t>(in.num_seqs) * in.max_blocks_per_seq, -1);

  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    ScheduledSeq& ss = plan.seqs[s];
    Sequence& seq = *ss.seq;
    const int end = ss.start + ss.len;
    const int n = seq.num_tokens();
    assert(end <= n + ss.num_draft && ss.start == seq.num_computed_tokens);
    const int row0 = static_cast<int>(in.token_ids.size());
    for (int p = ss.start; p < end; ++p) {
      in.token_ids.push_back(p < n ? seq.token_ids[p] : seq.draft_ids[p - n]);
      in.positions.push_back(seq.rope_position(p));
      seq_pos.push_back(p);
      in.slot_mapping.push_back(seq.block_table[p / bs] * bs + p % bs);
    }
    for (const EmbedSpan& e : seq.embeds) {  // the rows of the positions this chunk computes
      const int a = std::max(ss.start, e.start), b = std::min(end, e.end());
      if (a >= b) continue;
      const int width = static_cast<int>(e.rows.size() / e.len);
      assert(in.embed_width == 0 || in.embed_width == width);
      in.embed_width = width;
      for (int p = a; p < b; ++p) in.embed_index.push_back(row0 + (p - ss.start));
      in.embed_rows.insert(in.embed_rows.end(), e.rows.begin() + static_cast<ptrdiff_t>(a - e.start) * width,
                           e.rows.begin() + static_cast<ptrdiff_t>(b - e.start) * width);
      if (e.bidirectional) {
        assert(a == e.start && b == e.end());  // never split (chunk_len, the prefix cache's back-off)
        bidirectional = true;
      }
    }
    in.cu_q.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.context_lens.push_back(end);
    std::copy_n(seq.block_table.begin(), block_manager_->blocks_for(end),
                in.block_tables.begin() + static_cast<ptrdiff_t>(s) * in.max_blocks_per_seq);
    in.adapter_ids.push_back(seq.adapter_id);
    in.state_slots.push_back(seq.state_slot);
    in.request_ids.push_back(static_cast<int64_t>(seq.id));
    in.max_query_len = std::max(in.max_query_len, ss.len);
    in.max_context_len = std::max(in.max_context_len, end);

    if (seq.wants_prompt_logprobs()) {
      const int lo = std::max(ss.start, seq.prompt_logprobs_next);
      const int hi = std::min(end, seq.num_prompt_tokens - 1);
      if (lo < hi) {
        ss.prompt_lp_row = in.num_logits_rows();
        ss.prompt_lp_pos = lo;
        ss.num_prompt_lp_rows = hi - lo;
        for (int p = lo; p < hi; ++p) in.logits_rows.push_back(row0 + (p - ss.start));
        in.need_logits.insert(in.need_logits.end(), hi - lo, 1);
      }
    }
    if (end == n + ss.num_draft) {  // the last token's row, then one per draft token
      ss.sample_row = in.num_logits_rows();
      // (speculative verification rows of a grammar stay on the host: the walk masks row by row)
      const bool need = Sampler::needs_logits(seq, config_.device_sampling, config_.device_masks && ss.num_draft == 0);
      // The device draws the row's token when the engine takes it from there: row j of a span
      // draws at step num_output + j, as plain decoding would (Sampler::sample).
      const bool draw = config_.device_sampling && !need && seq.forced.empty() && !seq.params.greedy();
      if (config_.device_sampling && !need && seq.params.logprobs >= 0) in.device_logprobs = true;
      for (int j = 0; j <= ss.num_draft; ++j) {
        in.logits_rows.push_back(row0 + ss.len - 1 - ss.num_draft + j);
        in.need_logits.push_back(need ? 1 : 0);
        if (!draw) continue;
        const SamplingParams& p = seq.params;
        in.sample_params.resize(in.logits_rows.size() * kSampleParamCols, 0.0f);
        pack_sample_params(in.sample_params.data() + (in.logits_rows.size() - 1) * kSampleParamCols, p.temperature,
                           p.top_k, p.top_p, p.min_p, seq.seed, static_cast<uint32_t>(seq.num_output_tokens() + j));
      }
    }
  }
  in.num_tokens = static_cast<int32_t>(in.token_ids.size());
  if (config_.device_sampling) in.sample_params.resize(in.logits_rows.size() * kSampleParamCols, 0.0f);
  // With embedding rows the runner takes a kv_limit: causal (the own position in the sequence, not
  // the rope position a span's position_shift moved) except inside bidirectional spans: the span's end.
  if (bidirectional || !in.embed_index.empty()) {
    in.kv_limit = std::move(seq_pos);
    for (size_t s = 0; s < plan.seqs.size(); ++s) {
      const ScheduledSeq& ss = plan.seqs[s];
      for (const EmbedSpan& e : ss.seq->embeds) {
        if (!e.bidirectional) continue;
        const int a = std::max(ss.start, e.start), b = std::min(ss.start + ss.len, e.end());
        for (int p = a; p < b; ++p) in.kv_limit[in.cu_q[s] + (p - ss.start)] = e.end() - 1;
      }
    }
  }
}

void Scheduler::update(const StepPlan& plan) {
  for (const ScheduledSeq& ss : plan.seqs) {
    Sequence& seq = *ss.seq;
    if (seq.is_finished() || ss.num_draft > 0) continue;  // failed or aborted while the step ran; or accept()
    seq.num_computed_tokens = ss.start + ss.len;
    block_manager_->cache_computed_blocks(seq);
  }
}

void Scheduler::accept(Sequence& seq) {
  seq.num_computed_tokens = seq.num_tokens() - 1;
  seq.draft_ids.clear();
  block_manager_->cache_computed_blocks(seq);
  block_manager_->trim(seq);
}

void Scheduler::finish(Sequence* seq, FinishReason reason, std::string message) {
  if (seq->status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    block_manager_->deallocate(*seq);
    free_state_slots_.push_back(seq->state_slot);
    seq->state_slot = -1;
  } else if (seq->status == SequenceStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  seq->status = SequenceStatus::kFinished;
  seq->finish_reason = reason;
  seq->finish_message = std::move(message);
}

void Scheduler::preempt(Sequence* seq) {
  block_manager_->deallocate(*seq);
  free_state_slots_.push_back(seq->state_slot);
  seq->state_slot = -1;
  seq->status = SequenceStatus::kWaiting;
  seq->num_computed_tokens = 0;
  seq->num_cached_tokens = 0;
  seq->draft_ids.clear();
  seq->draft_computed = 0;
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(seq);
}

}  // namespace surogate::serve
