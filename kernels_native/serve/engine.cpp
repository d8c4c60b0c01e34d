#include "serve/engine.h"

#include <chrono>
#include <random>

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>

#include "core/sample_math.h"
#include "runtime/op_checks_sample.h"

#include "core/thread_pool.h"

namespace surogate::serve {

namespace {

Status config_error(const char* field, const std::string& what, const std::string& hint) {
  return Status(StatusCode::kInvalidArgument, str_cat("engine config '", field, "' ", what), __FILE__, __LINE__,
                hint);
}

constexpr int kMaxSpeculativeTokens = 32;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A 64-bit digest of n bytes (splitmix64 over 8-byte words, the length mixed in first).
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = splitmix64(seed ^ n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
    h = splitmix64(h ^ w);
  }
  return h;
}

// The embedding spans of a prompt of P tokens, for a runner taking rows of `width` (0: none):
// each inside the prompt, none empty, none overlapping another, rows of that width. Sorted by
// start on success, each with its digest (of the key, or of the rows when there is no key).
Status check_embeds(std::vector<EmbedSpan>* spans, const std::vector<int>& widths, int P, int width) {
  if (spans->empty()) return Status::OK();
  SG_CHECK(width > 0, StatusCode::kInvalidArgument, "embeds: this model runner takes no embedding rows",
           "serve the model through surogate.serve (its ProgramRunner takes them), or submit token ids only");
  for (size_t i = 0; i < spans->size(); ++i) {
    EmbedSpan& e = (*spans)[i];
    SG_CHECK(e.len > 0, StatusCode::kInvalidArgument, str_cat("embeds[", i, "].rows is empty"),
             "give at least one row, or leave the span out");
    SG_CHECK(widths[i] == width, StatusCode::kInvalidArgument,
             str_cat("embeds[", i, "].rows has width ", widths[i], "; the model's hidden size is ", width),
             "give rows of the model's hidden size (the output of its vision projector)");
    SG_CHECK(e.start >= 0 && e.start + static_cast<int64_t>(e.len) <= P, StatusCode::kInvalidArgument,
             str_cat("embeds[", i, "] covers prompt positions ", e.start, "..", int64_t{e.start} + e.len - 1,
                     " but the prompt has ", P, " tokens"),
             "a span's start + len(rows) must lie inside the prompt (its placeholder tokens)");
    e.digest = e.key.empty() ? hash_bytes(e.rows.data(), e.rows.size() * sizeof(float), 0x726f7773ULL)
                             : hash_bytes(e.key.data(), e.key.size(), 0x6b6579ULL);
    if (e.position_shift != 0) {  // the same rows shifting later positions otherwise: other K / V after the span
      e.digest = splitmix64(e.digest ^ static_cast<uint64_t>(static_cast<uint32_t>(e.position_shift)));
    }
  }
  std::vector<size_t> order(spans->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return (*spans)[a].start < (*spans)[b].start; });
  for (size_t k = 1; k < order.size(); ++k) {
    const EmbedSpan &a = (*spans)[order[k - 1]], &b = (*spans)[order[k]];
    SG_CHECK(b.start >= a.end(), StatusCode::kInvalidArgument,
             str_cat("embeds[", order[k], "] (positions ", b.start, "..", b.end() - 1, ") overlaps embeds[",
                     order[k - 1], "] (positions ", a.start, "..", a.end() - 1, ")"),
             "each prompt position takes at most one row");
  }
  int64_t shift = 0;  // rope positions after each span: p + the shifts so far, never negative
  for (size_t k = 0; k < order.size(); ++k) {
    const EmbedSpan& e = (*spans)[order[k]];
    shift += e.position_shift;
    SG_CHECK(e.end() + shift >= 0, StatusCode::kInvalidArgument,
             str_cat("embeds[", order[k], "].position_shift ", e.position_shift, " puts the rope position after it at ",
                     e.end() + shift),
             "position shifts may move later tokens back by at most their position");
  }
  std::vector<EmbedSpan> sorted;
  sorted.reserve(spans->size());
  for (size_t i : order) sorted.push_back(std::move((*spans)[i]));
  *spans = std::move(sorted);
  return Status::OK();
}

SchedulerConfig scheduler_config(const EngineConfig& c, const ModelRunner& runner) {
  SchedulerConfig s;
  s.max_num_seqs = c.max_num_seqs;
  s.max_num_batched_tokens = c.max_num_batched_tokens;
  s.max_model_len = c.max_model_len;
  s.device_sampling = runner.samples_on_device();
  // Grammar masks applied on the device (its sample op) unless SUROGATE_DEVICE_MASKS=0 (read once
  // per engine: the host path for comparison and as a fallback).
  const char* env = std::getenv("SUROGATE_DEVICE_MASKS");
  s.device_masks = s.device_sampling && runner.masks_on_device() && !(env != nullptr && std::string(env) == "0");
  return s;
}

}  // namespace

Status Engine::create(const EngineConfig& config, std::shared_ptr<ModelRunner> runner, std::unique_ptr<Engine>* out,
                      std::shared_ptr<ModelRunner> draft) {
  EngineConfig c = config;
  if (!runner) return SG_ERROR(StatusCode::kInvalidArgument, "the engine needs a model runner", "");
  const int V = runner->vocab_size();
  if (V <= 0) return SG_ERROR(StatusCode::kInvalidArgument, str_cat("model runner reports vocab_size ", V), "");
  if (c.block_size <= 0) return config_error("block_size", str_cat("is ", c.block_size), "use a positive size, e.g. 16");
  if (c.num_blocks <= 0) {
    return config_error("num_blocks", str_cat("is ", c.num_blocks), "size the KV cache: at least one block");
  }
  if (c.max_num_seqs <= 0) return config_error("max_num_seqs", str_cat("is ", c.max_num_seqs), "use e.g. 128");
  if (c.max_num_batched_tokens <= 0) {
    return config_error("max_num_batched_tokens", str_cat("is ", c.max_num_batched_tokens), "use e.g. 8192");
  }
  const int64_t capacity = static_cast<int64_t>(c.num_blocks) * c.block_size;
  if (capacity > INT32_MAX) return config_error("num_blocks", "x block_size overflows 32-bit slot ids", "");
  if (c.max_model_len < 0 || c.max_model_len > capacity) {
    return config_error("max_model_len", str_cat("is ", c.max_model_len, " but the KV cache holds ", capacity, " tokens"),
                        "lower max_model_len (0 = the cache's capacity) or add KV blocks");
  }
  if (c.max_model_len == 0) c.max_model_len = static_cast<int>(capacity);
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i) {
    if (c.eos_token_ids[i] < 0 || c.eos_token_ids[i] >= V) {
      return config_error("eos_token_ids", str_cat("[", i, "] = ", c.eos_token_ids[i], " is not a token id"),
                          str_cat("token ids are in [0, ", V, ")"));
    }
  }
  if (!c.speculative_method.empty() && c.speculative_method != "ngram" && c.speculative_method != "draft") {
    return config_error("speculative_method", str_cat("is '", c.speculative_method, "'"),
                        "use 'ngram' (prompt lookup) or 'draft' (a draft model), or leave it empty for no speculation");
  }
  if ((c.speculative_method == "draft") != (draft != nullptr)) {
    return draft ? config_error("speculative_method", str_cat("is '", c.speculative_method, "' with a draft model runner"),
                                "use speculative_method 'draft' with a draft model, or pass none")
                 : config_error("speculative_method", "is 'draft' without a draft model runner",
                                "pass the draft model's runner (surogate serve --speculative-model PATH)");
  }
  if (draft && draft->vocab_size() <= 0) {
    return SG_ERROR(StatusCode::kInvalidArgument, str_cat("the draft model runner reports vocab_size ", draft->vocab_size()), "");
  }
  if (c.num_speculative_tokens < 0 || c.num_speculative_tokens > kMaxSpeculativeTokens) {
    return config_error("num_speculative_tokens", str_cat("is ", c.num_speculative_tokens),
                        str_cat("use 1 to ", kMaxSpeculativeTokens, " with a speculative_method, 0 without"));
  }
  if (c.speculative_method.empty() != (c.num_speculative_tokens == 0)) {
    return config_error(c.speculative_method.empty() ? "speculative_method" : "num_speculative_tokens", "is not set",
                        "speculative decoding needs both a method and num_speculative_tokens >= 1");
  }
  if (c.speculative_disable_by_batch_size < 0) {
    return config_error("speculative_disable_by_batch_size", str_cat("is ", c.speculative_disable_by_batch_size),
                        "use 0 (always speculate) or a number of running sequences");
  }
  if (c.speculative_method == "ngram" && (c.ngram.min_n < 1 || c.ngram.max_n < c.ngram.min_n)) {
    return config_error("prompt_lookup_min", str_cat("is ", c.ngram.min_n, " with prompt_lookup_max ", c.ngram.max_n),
                        "use 1 <= prompt_lookup_min <= prompt_lookup_max");
  }
  out->reset(new Engine(c, std::move(runner), std::move(draft)));
  return Status::OK();
}

Engine::Engine(const EngineConfig& config, std::shared_ptr<ModelRunner> runner, std::shared_ptr<ModelRunner> draft)
    : config_(config), runner_(std::move(runner)),
      drafter_(draft ? std::make_unique<DraftProposer>(std::move(draft), config.block_size, config.max_num_batched_tokens)
                     : nullptr),
      block_manager_(config.num_blocks, config.block_size, config.enable_prefix_caching),
      scheduler_(scheduler_config(config, *runner_), &block_manager_), sampler_(runner_->vocab_size()) {
  counters_.spec_accepted_per_pos.assign(config.num_speculative_tokens, 0);
  seed_base_ = config.has_seed ? config.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  publish_stats();
}

Engine::~Engine() { shutdown(); }

// ---- the caller's side -------------------------------------------------------------------

Status Engine::submit(Request req, uint64_t* id) {
  const int V = sampler_.vocab_size();
  SG_CHECK_ARG(!req.prompt_token_ids.empty(), "the prompt is empty: a request needs at least one token");
  for (size_t i = 0; i < req.prompt_token_ids.size(); ++i) {
    const int32_t t = req.prompt_token_ids[i];
    SG_CHECK(t >= 0 && t < V, StatusCode::kInvalidArgument,
             str_cat("prompt token [", i, "] = ", t, " is not a token id"), str_cat("token ids are in [0, ", V, ")"));
  }
  SG_CHECK(req.adapter_id >= -1, StatusCode::kInvalidArgument, str_cat("adapter id ", req.adapter_id, " is invalid"),
           "use -1 for the base model or an adapter slot id");
  if (req.params.eos_token_ids.empty()) req.params.eos_token_ids = config_.eos_token_ids;
  SG_RETURN_IF_ERROR(req.params.validate(V));
  SG_CHECK(!req.params.constrained || masker_ != nullptr, StatusCode::kInvalidArgument,
           "a constrained request (a grammar) on an engine without a token masker",
           "submit through surogate.serve.EngineClient, which installs the grammar engine");
  SG_RETURN_IF_ERROR(check_embeds(&req.embeds, req.embed_widths, static_cast<int>(req.prompt_token_ids.size()),
                                  runner_->hidden_size()));

  // The Philox key of every draw of this request (sampler.h): its seed, or one from the engine's base.
  const uint64_t seed =
      req.params.has_seed ? req.params.seed : splitmix64(seed_base_ ^ splitmix64(seed_counter_.fetch_add(1)));
  const uint64_t seq_id = next_id_.fetch_add(1);
  auto seq = std::make_unique<Sequence>(seq_id, std::move(req.prompt_token_ids), std::move(req.params),
                                        req.adapter_id, seed);
  seq->embeds = std::move(req.embeds);
  {
    std::lock_guard<std::mutex> lock(mu_);
    SG_CHECK(!shut_down_, StatusCode::kUnsupported, "the engine is shut down", "create a new engine");
    inbox_.push_back({std::move(seq), 0});
  }
  cv_.notify_one();
  *id = seq_id;
  return Status::OK();
}

void Engine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    inbox_.push_back({nullptr, id});
  }
  cv_.notify_one();
}

int Engine::reset_prefix_cache() {
  auto done = std::make_shared<std::promise<int>>();
  std::future<int> result = done->get_future();
  bool threaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return 0;
    threaded = running_;
    Command c;
    c.reset = done;
    inbox_.push_back(std::move(c));
  }
  if (!threaded) {  // step() mode: the caller's thread is the engine's
    drain_inbox();
    publish_stats();
  } else {
    cv_.notify_one();
  }
  return result.get();
}

void Engine::hold() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = true;
}

void Engine::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
  }
  cv_.notify_one();
}

Status Engine::start() {
  std::lock_guard<std::mutex> lock(mu_);
  SG_CHECK(!shut_down_, StatusCode::kUnsupported, "the engine is shut down", "create a new engine");
  SG_CHECK(!thread_.joinable(), StatusCode::kInvalidArgument, "the engine is already running", "");
  thread_ = std::thread([this] { loop(); });
  running_ = true;
  return Status::OK();
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  running_ = false;
  abort_all();  // the engine thread is gone: this thread owns the state now
  outputs_.close();
}

Status Engine::step() {
  SG_CHECK(!running_, StatusCode::kInvalidArgument, "step() while the engine thread is running",
           "use either start() and poll(), or step() alone");
  {
    std::lock_guard<std::mutex> lock(mu_);
    SG_CHECK(!shut_down_, StatusCode::kUnsupported, "the engine is shut down", "create a new engine");
  }
  step_once();
  return Status::OK();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---- the engine thread -------------------------------------------------------------------

void Engine::loop() {
  bool busy = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (!held_ && (busy || !inbox_.empty())); });
      if (stop_) return;
    }
    // A step that scheduled nothing while work is queued cannot happen (an idle cache fits any
    // admissible prompt); waiting for the inbox then avoids spinning should it ever.
    busy = step_once() && scheduler_.has_unfinished();
  }
}

bool Engine::step_once() {
  const auto t0 = std::chrono::steady_clock::now();
  drain_inbox();
  StepPlan plan = scheduler_.schedule();
  for (Sequence* seq : plan.rejected) {
    output_for(*seq);
    finished_.push_back(seq);
  }
  if (!plan.empty()) {
    StepOutput out;
    StepMasks masks;
    collect_masks(plan, &masks);
    std::future<void> filling;  // the masks, on a helper thread while the model runs
    if (!masks.seqs.empty()) {
      filling = std::async(std::launch::async, [this, &masks] { masks.status = fill_masks(&masks); });
    }
    const auto m0 = std::chrono::steady_clock::now();
    Status st = run(plan, &out);
    using clock = std::chrono::steady_clock;
    const auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    const auto r1 = clock::now();
    if (filling.valid()) filling.get();
    const auto r2 = clock::now();
    if (st.ok() && masks.status.ok()) masks.status = check_draws(out, &masks);
    const auto r3 = clock::now();
    if (st.ok()) st = sample_masked(plan, masks, &out);
    const auto r4 = clock::now();
    if (!masks.seqs.empty()) {
      counters_.mask_wait_seconds += seconds(r1, r2);
      counters_.check_seconds += seconds(r2, r3);
      counters_.redraw_seconds += seconds(r3, r4);
    }
    counters_.model_seconds += seconds(m0, r4);
    if (st.ok()) {
      postprocess(plan, out, masks);
    } else {
      counters_.last_error = st.to_string();
      for (const ScheduledSeq& ss : plan.seqs) {
        finish(*ss.seq, FinishReason::kError, str_cat("model runner failed: ", st.to_string()));
      }
    }
    ++counters_.num_steps;
    counters_.num_preemptions += plan.num_preempted;
  }
  counters_.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  collect_finished();
  return !plan.empty() || !plan.rejected.empty();
}

void Engine::drain_inbox() {
  std::vector<Command> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands.swap(inbox_);
  }
  for (Command& c : commands) {
    if (c.reset) {
      // Publish before answering: the caller reads stats() as soon as the future is set.
      const int dropped = block_manager_.reset_prefix_cache();
      publish_stats();
      c.reset->set_value(dropped);
      continue;
    }
    if (c.seq) {
      Sequence* seq = c.seq.get();
      sequences_.emplace(seq->id, std::move(c.seq));
      scheduler_.add(seq);
      continue;
    }
    auto it = sequences_.find(c.abort_id);
    if (it == sequences_.end() || it->second->is_finished()) continue;
    finish(*it->second, FinishReason::kAbort, "");
  }
}

Status Engine::run(const StepPlan& plan, StepOutput* out) {
  SG_RETURN_IF_ERROR(runner_->run(plan.input, out));
  const int64_t R = plan.input.num_logits_rows(), V = sampler_.vocab_size();
  SG_CHECK(out->tokens.empty() || static_cast<int64_t>(out->tokens.size()) == R, StatusCode::kShapeMismatch,
           str_cat("model runner returned ", out->tokens.size(), " tokens for ", R, " logits rows"),
           "return one per StepInput.logits_rows entry, or none");
  const bool device_lp = plan.input.device_logprobs && runner_->samples_on_device();
  SG_CHECK(!device_lp || (static_cast<int64_t>(out->tokens.size()) == R &&
                          static_cast<int64_t>(out->logprobs.size()) == R && static_cast<int64_t>(out->ranks.size()) == R),
           StatusCode::kShapeMismatch,
           str_cat("model runner returned ", out->tokens.size(), " tokens, ", out->logprobs.size(), " logprobs and ",
                   out->ranks.size(), " ranks for ", R, " logits rows whose logprobs it samples"),
           "a runner that samples on its device returns all three when StepInput.device_logprobs is set");
  const Tensor& t = out->logits;
  SG_CHECK(t.device.is_cpu() && t.dtype == DType::kF32 && t.ndim == 2 && t.shape[0] == R && t.shape[1] == V &&
               (R == 0 || (t.data != nullptr && t.strides[1] == 1 && t.strides[0] >= V)),
           StatusCode::kShapeMismatch,
           str_cat("model runner returned logits ", t.describe(), "; expected float32[", R, ", ", V, "] on cpu"),
           "return one row per StepInput.logits_rows entry, with contiguous rows");
  return Status::OK();
}

Status Engine::sample_masked(const StepPlan& plan, const StepMasks& masks, StepOutput* out) {
  if (!scheduler_.config().device_masks || masks.seqs.empty() || !masks.status.ok()) return Status::OK();
  // The grammar rows whose logits stayed on the device (need_logits 0): drawn again under their
  // masks by the runner. masks.seqs is a subsequence of the sampled sequences, in plan order.
  MaskedRows rows;
  rows.words = mask_words(sampler_.vocab_size());
  size_t k = 0;
  for (const ScheduledSeq& ss : plan.seqs) {
    if (k == masks.seqs.size()) break;
    if (ss.sample_row < 0 || ss.seq != masks.seqs[k]) continue;
    const Sequence& seq = *ss.seq;
    const size_t at = k++;
    const uint32_t* mask = masks.mask[at];
    if (plan.input.need_logits[ss.sample_row]) continue;  // the host samples it (logit_bias, penalties, ...)
    if (masks.checked[at] && !masks.redraw[at]) continue;  // its draw was allowed: kept
    rows.rows.push_back(ss.sample_row);
    // The row's parameters as the scheduler packed them for the step's own draw (zeros: greedy);
    // a refused checked draw is drawn again from the second uniform.
    const float* packed = plan.input.sample_params.data() + static_cast<size_t>(ss.sample_row) * kSampleParamCols;
    rows.sample_params.insert(rows.sample_params.end(), packed, packed + kSampleParamCols);
    if (masks.redraw[at] && !seq.params.greedy()) {
      float* p = rows.sample_params.data() + rows.sample_params.size() - kSampleParamCols;
      uint32_t step;
      std::memcpy(&step, p + kSampleStep, sizeof(step));
      step |= kSampleRedraw;
      std::memcpy(p + kSampleStep, &step, sizeof(step));
    }
    rows.masks.push_back(mask);
    rows.logprobs |= seq.params.logprobs >= 0;
  }
  if (rows.rows.empty()) return Status::OK();
  counters_.device_masked_rows += static_cast<int64_t>(rows.rows.size());
  return runner_->sample_masked(rows, out);
}

void Engine::collect_masks(const StepPlan& plan, StepMasks* masks) {
  if (masker_ == nullptr) return;
  const bool device = scheduler_.config().device_masks;
  for (const ScheduledSeq& ss : plan.seqs) {
    Sequence& seq = *ss.seq;
    if (ss.sample_row < 0 || !seq.masked_next()) continue;
    MaskRequest r;
    r.request_id = seq.id;
    const int from = std::max(seq.mask_fed, seq.answer_start);
    r.new_tokens.assign(seq.token_ids.begin() + std::min(from, seq.num_tokens()), seq.token_ids.end());
    r.last_refused = seq.draw_refused;
    seq.mask_fed = seq.num_tokens();
    masks->seqs.push_back(&seq);
    masks->requests.push_back(std::move(r));
    masks->sample_row.push_back(ss.sample_row);
    // Drawn on the device unmasked, then checked; a host row's Sampler checks its own draw.
    masks->checked.push_back(device && !plan.input.need_logits[ss.sample_row] && ss.num_draft == 0 &&
                             sampler_.checks_first(seq.params));
  }
  masks->mask.assign(masks->seqs.size(), nullptr);
  masks->redraw.assign(masks->seqs.size(), 0);
}

Status Engine::fill_masks(StepMasks* masks) {
  const int W = mask_words(sampler_.vocab_size());
  const bool can_check = masker_->checks_tokens();
  std::vector<MaskRequest> fill, advance;
  std::vector<size_t> filled, advanced;
  for (size_t k = 0; k < masks->seqs.size(); ++k) {
    if (masks->checked[k] && can_check) {
      advanced.push_back(k);
      advance.push_back(std::move(masks->requests[k]));
    } else {
      filled.push_back(k);
      fill.push_back(std::move(masks->requests[k]));
    }
  }
  // All allowed until filled: a masker that writes nothing leaves sampling unconstrained. The
  // checked rows' part: the masks the masker fills beside the model (it says which).
  masks->rows.assign((filled.size() + advanced.size()) * W, ~0u);
  for (size_t i = 0; i < filled.size(); ++i) masks->mask[filled[i]] = masks->rows.data() + i * W;
  if (!fill.empty()) SG_RETURN_IF_ERROR(masker_->fill(fill, masks->rows.data(), W));
  if (!advance.empty()) {
    uint32_t* rows = masks->rows.data() + filled.size() * W;
    std::vector<uint8_t> ready(advance.size(), 0);
    SG_RETURN_IF_ERROR(masker_->check(advance, nullptr, ready.data(), rows, W));
    for (size_t i = 0; i < advanced.size(); ++i) {
      if (ready[i]) masks->mask[advanced[i]] = rows + i * W;
    }
  }
  return Status::OK();
}

Status Engine::check_draws(const StepOutput& out, StepMasks* masks) {
  const int W = mask_words(sampler_.vocab_size()), V = sampler_.vocab_size();
  std::vector<size_t> ask;
  std::vector<MaskRequest> asks;
  std::vector<int32_t> candidates;
  int64_t checked = 0, allowed = 0;
  for (size_t k = 0; k < masks->seqs.size(); ++k) {
    if (!masks->checked[k]) continue;
    SG_CHECK(static_cast<size_t>(masks->sample_row[k]) < out.tokens.size(), StatusCode::kInternal,
             "a checked grammar row without its device draw", "report this: device masks need device sampling");
    const int32_t t = out.tokens[masks->sample_row[k]];
    if (t < 0 || t >= V) continue;  // a non-finite row: postprocess fails it
    ++checked;
    if (masks->mask[k] != nullptr) {  // its mask is filled: the draw's bit
      if (mask_allows(masks->mask[k], t)) {
        ++allowed;
      } else {
        masks->redraw[k] = 1;
      }
      masks->seqs[k]->draw_refused = masks->redraw[k];
      continue;
    }
    ask.push_back(k);
    MaskRequest r;
    r.request_id = masks->seqs[k]->id;
    asks.push_back(std::move(r));
    candidates.push_back(t);
  }
  counters_.grammar_checked_rows += checked;
  if (!ask.empty()) {
    std::vector<uint8_t> ok(ask.size(), 0);
    if (check_rows_.size() < ask.size() * W) check_rows_.resize(ask.size() * W);
    SG_RETURN_IF_ERROR(masker_->check(asks, candidates.data(), ok.data(), check_rows_.data(), W));
    for (size_t i = 0; i < ask.size(); ++i) {
      if (ok[i]) {
        ++allowed;
      } else {
        masks->mask[ask[i]] = check_rows_.data() + i * W;
        masks->redraw[ask[i]] = 1;
      }
      masks->seqs[ask[i]]->draw_refused = ok[i] ? 0 : 1;
    }
  }
  counters_.grammar_checked_allowed += allowed;
  return Status::OK();
}

void Engine::postprocess(const StepPlan& plan, const StepOutput& step, const StepMasks& masks) {
  scheduler_.update(plan);
  const Tensor& logits = step.logits;
  const float* base = logits.ptr<float>();
  const int64_t stride = logits.ndim == 2 ? logits.strides[0] : 0;
  auto row = [&](int r) { return base + r * stride; };

  // Prompt logprobs of this chunk.
  for (const ScheduledSeq& ss : plan.seqs) {
    Sequence& seq = *ss.seq;
    for (int j = 0; j < ss.num_prompt_lp_rows; ++j) {
      const int pos = ss.prompt_lp_pos + j;
      seq.prompt_logprobs.push_back(
          sampler_.logprob(row(ss.prompt_lp_row + j), seq.token_ids[pos + 1], seq.params.prompt_logprobs));
    }
    if (ss.num_prompt_lp_rows > 0) seq.prompt_logprobs_next = ss.prompt_lp_pos + ss.num_prompt_lp_rows;
  }

  // Sampling is independent per sequence (each draw a function of its seed and step): spread it over the pool.
  // A span with drafts samples row after row while each token equals its draft (see engine.h);
  // the tokens go onto token_ids for the penalties of the next row and come off again after.
  std::vector<const ScheduledSeq*> to_sample;
  for (const ScheduledSeq& ss : plan.seqs) {
    if (ss.sample_row >= 0) to_sample.push_back(&ss);
  }
  std::vector<std::vector<int32_t>> tokens(to_sample.size());
  std::vector<std::vector<TokenLogprob>> lps(to_sample.size());
  std::vector<Status> errors(to_sample.size());
  // Each sampled sequence's mask row (masks.seqs is a subsequence of to_sample, in plan order).
  std::vector<const uint32_t*> allowed(to_sample.size(), nullptr);
  for (size_t i = 0, k = 0; i < to_sample.size() && k < masks.seqs.size(); ++i) {
    if (to_sample[i]->seq != masks.seqs[k]) continue;
    if (!masks.status.ok()) {
      errors[i] = masks.status;
    } else {
      allowed[i] = masks.mask[k];
    }
    ++k;
  }
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max(1, sampler_.vocab_size()));
  parallel_for(0, static_cast<int64_t>(to_sample.size()), grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const ScheduledSeq& ss = *to_sample[i];
      Sequence& seq = *ss.seq;
      if (!errors[i].ok()) continue;  // the grammar failed
      if (!seq.forced.empty()) {  // the end of a reasoning span: appended, not sampled
        tokens[i].push_back(seq.forced.front());
        if (seq.params.logprobs >= 0) lps[i].push_back(sampler_.logprob(row(ss.sample_row), tokens[i][0], seq.params.logprobs));
        continue;
      }
      int pushed = 0;
      for (int j = 0; j <= ss.num_draft; ++j) {
        const int sr = ss.sample_row + j;
        int32_t t = -1;
        const bool on_device = !step.tokens.empty() && !plan.input.need_logits[sr];
        if (on_device) {  // the device's argmax, or its draw (the same as sample() would make)
          t = step.tokens[sr];
          if (t == sample::kNothingAllowed && allowed[i] != nullptr) {  // the host's error for a mask allowing nothing
            errors[i] = Sampler::all_masked_error(true);
            break;
          }
          if (t < 0 || t >= sampler_.vocab_size()) {
            errors[i] = SG_ERROR(StatusCode::kInternal, "the model produced a non-finite logit (NaN or +inf)",
                                 "check the model's weights and dtype; NaN logits usually mean an overflow");
            break;
          }
        } else {
          errors[i] = sampler_.sample(row(sr), seq, &t, allowed[i]);
          if (!errors[i].ok()) break;
        }
        if (seq.params.logprobs >= 0) {
          if (on_device && !step.logprobs.empty()) {  // logprobs 0: the token's own, from the device
            TokenLogprob lp;
            lp.token_id = t;
            lp.logprob = step.logprobs[sr];
            lp.rank = step.ranks[sr];
            lps[i].push_back(std::move(lp));
          } else {
            lps[i].push_back(sampler_.logprob(row(sr), t, seq.params.logprobs));
          }
        }
        tokens[i].push_back(t);
        if (j == ss.num_draft || t != seq.draft_ids[j]) break;  // the bonus token, or a rejection
        seq.token_ids.push_back(t);
        ++pushed;
        if (stop_reason(seq, t) != FinishReason::kNone) break;  // never emit past a stop
      }
      seq.token_ids.resize(seq.token_ids.size() - pushed);
    }
  });

  std::vector<Sequence*> to_draft;  // speculative_method "draft": proposed for together, after the loop
  for (size_t i = 0; i < to_sample.size(); ++i) {
    const ScheduledSeq& ss = *to_sample[i];
    Sequence& seq = *ss.seq;
    if (!errors[i].ok()) {
      counters_.last_error = errors[i].to_string();
      finish(seq, FinishReason::kError, errors[i].message());
      continue;
    }
    if (seq.num_output_tokens() == 0) counters_.prompt_tokens += seq.num_prompt_tokens;
    const int committed = seq.num_tokens();  // the draft's KV past this holds drafts: kept only where accepted
    if (ss.num_draft > 0) {
      int accepted = 0;
      while (accepted < static_cast<int>(tokens[i].size()) && accepted < ss.num_draft &&
             tokens[i][accepted] == seq.draft_ids[accepted]) {
        ++counters_.spec_accepted_per_pos[accepted];
        ++accepted;
      }
      ++counters_.spec_num_drafts;
      counters_.spec_num_draft_tokens += ss.num_draft;
      counters_.spec_num_accepted_tokens += accepted;
      seq.draft_computed = std::min(seq.draft_computed, committed + accepted);
    } else {
      seq.draft_computed = std::min(seq.draft_computed, committed);
    }
    RequestOutput& out = output_for(seq);
    const size_t m = tokens[i].size();
    for (size_t j = 0; j < m; ++j) {
      const int32_t t = tokens[i][j];
      ++counters_.generation_tokens;
      const bool forced = !seq.forced.empty();
      if (forced) seq.forced.pop_front();
      seq.token_ids.push_back(t);
      out.new_token_ids.push_back(t);
      if (seq.params.logprobs >= 0) out.logprobs.push_back(std::move(lps[i][j]));
      track_reasoning(seq, t, forced);
      if (j + 1 == m && ss.num_draft > 0) scheduler_.accept(seq);  // before a stop frees the blocks
      check_stop(seq, t);
      if (seq.is_finished()) break;  // only the last can stop: the walk ended there
    }
    if (!seq.is_finished() && config_.num_speculative_tokens > 0) {
      if (drafter_) {
        to_draft.push_back(&seq);
      } else {
        propose(seq);
      }
    }
  }
  if (!to_draft.empty()) propose_drafts(to_draft);
}

FinishReason Engine::stop_reason(const Sequence& seq, int32_t token) const {
  const SamplingParams& p = seq.params;
  const bool past_min = seq.num_output_tokens() >= p.min_tokens;
  auto contains = [token](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if (past_min && ((!p.ignore_eos && contains(p.eos_token_ids)) || contains(p.stop_token_ids))) return FinishReason::kStop;
  if (p.max_tokens > 0 && seq.num_output_tokens() >= p.max_tokens) return FinishReason::kLength;
  if (seq.num_tokens() >= config_.max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

int Engine::draft_budget(const Sequence& seq) const {
  if (!seq.can_speculate()) return 0;
  if (config_.speculative_disable_by_batch_size > 0 &&
      scheduler_.num_running() > config_.speculative_disable_by_batch_size) {
    return 0;
  }
  // No draft past what the request may still emit: the verified span's bonus token is one more.
  int k = std::min(config_.num_speculative_tokens, config_.max_model_len - seq.num_tokens());
  if (seq.params.max_tokens > 0) k = std::min(k, seq.params.max_tokens - seq.num_output_tokens() - 1);
  return std::max(k, 0);
}

void Engine::propose(Sequence& seq) {
  seq.draft_ids.clear();
  const int k = draft_budget(seq);
  if (k > 0) ngram_propose(seq.token_ids, config_.ngram, k, &seq.draft_ids);
}

void Engine::propose_drafts(const std::vector<Sequence*>& seqs) {
  std::vector<int> want(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) want[i] = draft_budget(*seqs[i]);
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = drafter_->propose(seqs, want, &block_manager_, scheduler_.num_running());
  counters_.model_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int V = sampler_.vocab_size();
  for (Sequence* seq : seqs) {
    if (!st.ok()) {  // no drafts this time: the target decodes plainly, and the draft starts over
      seq->draft_ids.clear();
      seq->draft_computed = 0;
      continue;
    }
    auto past = std::find_if(seq->draft_ids.begin(), seq->draft_ids.end(), [V](int32_t t) { return t >= V; });
    seq->draft_ids.erase(past, seq->draft_ids.end());  // a draft vocabulary's padding ids the target lacks
    block_manager_.mark_drafted(*seq);
  }
  if (!st.ok()) counters_.last_error = str_cat("draft model failed: ", st.to_string());
}

void Engine::track_reasoning(Sequence& seq, int32_t token, bool forced) {
  const SamplingParams& p = seq.params;
  if (p.reasoning_end_token_id < 0) return;
  auto spend = [&] {  // the budget ran out: close the span the way the template does
    if (p.max_reasoning_tokens >= 0 && seq.reasoning_tokens >= p.max_reasoning_tokens && seq.forced.empty()) {
      seq.forced.assign(p.reasoning_end_ids.begin(), p.reasoning_end_ids.end());
    }
  };
  if (!seq.in_reasoning) {
    // The model opens the span itself only as its first token (a template that leaves <think> to it).
    if (!seq.reasoning_done && token == p.reasoning_start_token_id && seq.num_output_tokens() == 1) {
      seq.in_reasoning = true;
      seq.answer_start = -1;
      spend();
    }
    return;
  }
  if (token == p.reasoning_end_token_id) {
    seq.in_reasoning = false;
    seq.reasoning_done = true;
    seq.answer_start = seq.num_tokens();
    seq.forced.clear();
    return;
  }
  if (!forced) {
    ++seq.reasoning_tokens;
    spend();
  }
}

void Engine::check_stop(Sequence& seq, int32_t token) {
  const FinishReason r = stop_reason(seq, token);
  if (r == FinishReason::kStop) {
    seq.stop_token_id = token;
    finish(seq, r, "");
  } else if (r == FinishReason::kLength) {
    const bool by_context = !(seq.params.max_tokens > 0 && seq.num_output_tokens() >= seq.params.max_tokens);
    finish(seq, r, by_context ? str_cat("reached the context limit of ", config_.max_model_len,
                                        " tokens (max_model_len)") : "");
  }
}

// Finish a sequence for any reason: out of the queues, blocks freed, an output that says why;
// erased at the end of the step.
void Engine::finish(Sequence& seq, FinishReason reason, std::string message) {
  if (seq.is_finished()) return;
  scheduler_.finish(&seq, reason, std::move(message));
  output_for(seq);
  finished_.push_back(&seq);
}

RequestOutput& Engine::output_for(Sequence& seq) {
  auto [it, inserted] = step_output_index_.emplace(seq.id, step_outputs_.size());
  if (inserted) {
    RequestOutput o;
    o.request_id = seq.id;
    step_outputs_.push_back(std::move(o));
  }
  return step_outputs_[it->second];
}

void Engine::collect_finished() {
  for (RequestOutput& out : step_outputs_) {
    Sequence& seq = *sequences_.at(out.request_id);
    out.num_prompt_tokens = seq.num_prompt_tokens;
    out.num_cached_tokens = seq.num_cached_tokens;
    out.num_output_tokens = seq.num_output_tokens();
    if (seq.params.prompt_logprobs >= 0 && !seq.prompt_logprobs_sent &&
        (!out.new_token_ids.empty() || seq.is_finished())) {
      out.has_prompt_logprobs = true;
      out.prompt_logprobs = std::move(seq.prompt_logprobs);
      seq.prompt_logprobs_sent = true;
    }
    if (seq.is_finished()) {
      out.finish_reason = seq.finish_reason;
      out.finish_message = seq.finish_message;
      out.stop_token_id = seq.stop_token_id;
    }
  }
  counters_.num_finished += static_cast<int64_t>(finished_.size());
  for (Sequence* seq : finished_) sequences_.erase(seq->id);
  finished_.clear();
  publish_stats();  // first: whoever reads these outputs sees stats that include them
  outputs_.push(std::move(step_outputs_));
  step_outputs_.clear();
  step_output_index_.clear();
}

void Engine::abort_all() {
  drain_inbox();
  for (auto& [id, seq] : sequences_) finish(*seq, FinishReason::kAbort, "the engine shut down");
  collect_finished();
}

void Engine::publish_stats() {
  EngineStats s = counters_;
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.blocks = block_manager_.stats();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

}  // namespace surogate::serve
