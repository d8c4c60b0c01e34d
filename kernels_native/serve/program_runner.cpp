#include "serve/program_runner.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "runtime/op_checks_sample.h"
#include "runtime/op_registry.h"

namespace surogate::serve {

namespace {

// The step inputs, in the order of Bucket::off (all int32 but sample_params, float32 [R, 8]).
constexpr int kNumInputs = 11;
constexpr const char* kInputs[kNumInputs] = {"input_ids",    "position_ids", "slot_mapping", "block_tables",
                                             "cu_q",         "context_lens", "logits_rows",  "state_slots",
                                             "embed_index",  "kv_limit",     "sample_params"};
enum { kIds, kPos, kSlots, kTables, kCuQ, kCtx, kRows, kStates, kEmbedIndex, kKvLimit, kSampleParams };
constexpr int kOptional = kStates;  // inputs from here on: bound when the Program has them

int pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Copy `n` elements of `dt` between host and device memory (either direction, or host to host).
Status copy_raw(void* dst, const Device& dst_dev, const void* src, const Device& src_dev, DType dt, int64_t n) {
  if (n == 0) return Status::OK();
  return copy_tensor(Tensor::view_of(const_cast<void*>(src), dt, {n}, src_dev), Tensor::view_of(dst, dt, {n}, dst_dev));
}

}  // namespace

ProgramRunner::ProgramRunner(const Config& config, CompileFn compile)
    : config_(config), compile_(std::move(compile)) {}

int ProgramRunner::bucket_tokens(int t) {
  if (t <= kSmallT) return t;
  if (t <= kMaxPad) return (t + kSmallT - 1) / kSmallT * kSmallT;
  return (t + kMaxPad - 1) / kMaxPad * kMaxPad;
}

void ProgramRunner::forget(int adapter) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    it = adapter == -2 || it->first.adapter == adapter ? buckets_.erase(it) : std::next(it);
  }
}

int ProgramRunner::num_programs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(buckets_.size());
}

float* ProgramRunner::logits_rows(int64_t R) {
  const size_t need = static_cast<size_t>(std::max<int64_t>(R, 1)) * config_.vocab_size;
  if (logits_.size() < need) logits_.resize(need);
  return logits_.data();
}

Status ProgramRunner::bucket(const BucketKey& key, Bucket** out) {
  auto it = buckets_.find(key);
  if (it != buckets_.end()) {
    *out = it->second.get();
    return Status::OK();
  }
  auto b = std::make_unique<Bucket>();
  b->key = key;
  SG_RETURN_IF_ERROR(compile_(key, &b->program, &b->owner));
  SG_CHECK(b->program != nullptr && b->program->device() == config_.device, StatusCode::kInternal,
           "the step compiler returned no Program for this runner's device", "");
  const int64_t E = key.E, TE = key.E > 0 ? key.T : 0;  // no embed inputs without embedding rows
  const int64_t sizes[kNumInputs] = {key.T, key.T, key.T, int64_t{key.S} * key.B, key.S + 1, key.S, key.R, key.S,
                                     E,     TE,    int64_t{key.R} * kSampleParamCols};
  const std::vector<int64_t> shapes[kNumInputs] = {{key.T}, {key.T}, {key.T}, {key.S, key.B}, {key.S + 1},
                                                   {key.S}, {key.R}, {key.S}, {E},              {TE},
                                                   {key.R, kSampleParamCols}};
  int64_t total = 0;
  for (int i = 0; i < kNumInputs; ++i) {
    b->off[i] = total;
    total += sizes[i];
  }
  b->host.assign(total, 0);
  SG_RETURN_IF_ERROR(allocate(config_.device, static_cast<size_t>(total) * sizeof(int32_t), &b->inputs));
  auto* base = static_cast<int32_t*>(b->inputs.get());
  for (int i = 0; i < kNumInputs; ++i) {
    const int id = b->program->find_buffer(kInputs[i]);
    if (id < 0 && i >= kOptional) continue;
    SG_CHECK(id >= 0, StatusCode::kInternal, str_cat("the step Program has no input '", kInputs[i], "'"), "");
    const DType dt = i == kSampleParams ? DType::kF32 : DType::kI32;
    SG_RETURN_IF_ERROR(b->program->bind(id, Tensor::view_of(base + b->off[i], dt, shapes[i], config_.device,
                                                            b->inputs)));
  }
  if (E > 0) {
    const int id = b->program->find_buffer("embed_rows");
    SG_CHECK(id >= 0 && config_.hidden_size > 0, StatusCode::kInternal,
             "a step with embedding rows, but its Program has no 'embed_rows' input or the runner no hidden_size",
             "build it with KVCache(embeds=True) and give the runner the model's hidden size");
    const int64_t C = config_.hidden_size;
    b->host_rows.assign(static_cast<size_t>(E * C), 0.0f);
    SG_RETURN_IF_ERROR(allocate(config_.device, b->host_rows.size() * sizeof(float), &b->rows));
    SG_RETURN_IF_ERROR(b->program->bind(id, Tensor::view_of(b->rows.get(), DType::kF32, {E, C}, config_.device,
                                                            b->rows)));
  }
  b->logits_id = b->program->find_buffer("logits");
  b->token_id = b->program->find_buffer("sampled");
  b->logprob_id = b->program->find_buffer("sampled.logprob");
  b->rank_id = b->program->find_buffer("sampled.rank");
  SG_CHECK(b->logits_id >= 0 && b->token_id >= 0 && b->logprob_id >= 0 && b->rank_id >= 0, StatusCode::kInternal,
           "the step Program has no 'logits' or 'sampled' (token, logprob, rank) outputs",
           "build it with CausalLM.build(mode='serve', kv=KVCache(..., sample=True))");
  *out = b.get();
  buckets_.emplace(key, std::move(b));
  return Status::OK();
}

Status ProgramRunner::run(const StepInput& in, StepOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const int R = in.num_logits_rows();
  SG_CHECK(in.sample_params.empty() || in.sample_params.size() == static_cast<size_t>(R) * kSampleParamCols,
           StatusCode::kInvalidArgument,
           str_cat("a step's sample_params hold ", in.sample_params.size(), " values for ", R, " logits rows"),
           "give 8 per logits row, or none (every row the argmax)");
  out->tokens.assign(R, -1);
  out->logprobs.assign(in.device_logprobs ? R : 0, 0.0f);
  out->ranks.assign(in.device_logprobs ? R : 0, 0);
  out->logits = Tensor();
  last_rows_.assign(R, {nullptr, -1});
  std::vector<int32_t> adapters(in.adapter_ids.begin(), in.adapter_ids.end());
  std::sort(adapters.begin(), adapters.end());
  adapters.erase(std::unique(adapters.begin(), adapters.end()), adapters.end());
  if (adapters.size() <= 1) {
    SG_RETURN_IF_ERROR(run_one(in, adapters.empty() ? -1 : adapters[0], out, {}));
  } else {
    // One sub-step per adapter over its sequences; rows go back to their places in `out`.
    logits_rows(R);
    std::vector<int> row_seq(R);  // the sequence of each logits row
    for (int r = 0, s = 0; r < R; ++r) {
      while (in.cu_q[s + 1] <= in.logits_rows[r]) ++s;
      row_seq[r] = s;
    }
    for (int a : adapters) {
      StepInput sub;
      sub.block_size = in.block_size;
      sub.max_blocks_per_seq = in.max_blocks_per_seq;
      sub.device_logprobs = in.device_logprobs;
      sub.cu_q.push_back(0);
      std::vector<int32_t> dst;
      for (int s = 0; s < in.num_seqs; ++s) {
        if (in.adapter_ids[s] != a) continue;
        const int lo = in.cu_q[s], hi = in.cu_q[s + 1], base = sub.num_tokens;
        sub.token_ids.insert(sub.token_ids.end(), in.token_ids.begin() + lo, in.token_ids.begin() + hi);
        sub.positions.insert(sub.positions.end(), in.positions.begin() + lo, in.positions.begin() + hi);
        sub.slot_mapping.insert(sub.slot_mapping.end(), in.slot_mapping.begin() + lo, in.slot_mapping.begin() + hi);
        if (!in.kv_limit.empty()) {
          sub.kv_limit.insert(sub.kv_limit.end(), in.kv_limit.begin() + lo, in.kv_limit.begin() + hi);
        }
        const int64_t C = in.embed_width;
        for (int e = 0; e < in.num_embed_rows(); ++e) {
          if (in.embed_index[e] < lo || in.embed_index[e] >= hi) continue;
          sub.embed_width = in.embed_width;
          sub.embed_index.push_back(base + in.embed_index[e] - lo);
          sub.embed_rows.insert(sub.embed_rows.end(), in.embed_rows.begin() + e * C, in.embed_rows.begin() + (e + 1) * C);
        }
        sub.num_tokens += hi - lo;
        sub.cu_q.push_back(sub.num_tokens);
        sub.context_lens.push_back(in.context_lens[s]);
        const auto row = in.block_tables.begin() + static_cast<ptrdiff_t>(s) * in.max_blocks_per_seq;
        sub.block_tables.insert(sub.block_tables.end(), row, row + in.max_blocks_per_seq);
        sub.adapter_ids.push_back(a);
        if (!in.state_slots.empty()) sub.state_slots.push_back(in.state_slots[s]);
        ++sub.num_seqs;
        for (int r = 0; r < R; ++r) {
          if (row_seq[r] != s) continue;
          sub.logits_rows.push_back(base + in.logits_rows[r] - lo);
          if (!in.need_logits.empty()) sub.need_logits.push_back(in.need_logits[r]);
          if (!in.sample_params.empty()) {
            const auto p = in.sample_params.begin() + static_cast<ptrdiff_t>(r) * kSampleParamCols;
            sub.sample_params.insert(sub.sample_params.end(), p, p + kSampleParamCols);
          }
          dst.push_back(r);
        }
      }
      SG_RETURN_IF_ERROR(run_one(sub, a, out, dst));
    }
  }
  if (!out->logits.defined() || out->logits.data == nullptr) {
    out->logits = Tensor::view_of(logits_rows(R), DType::kF32, {R, config_.vocab_size});
  }
  return Status::OK();
}

BucketKey ProgramRunner::bucket_key(const StepInput& in, int adapter) const {
  const int tp = bucket_tokens(in.num_tokens), pad = tp - in.num_tokens;
  const int pad_table = (pad + config_.block_size - 1) / config_.block_size;
  const bool embeds = in.num_embed_rows() > 0 || !in.kv_limit.empty();
  return BucketKey{tp, pow2(in.num_seqs + (pad ? 1 : 0)), pow2(std::max({in.max_blocks_per_seq, pad_table, 1})),
                   pow2(std::max(in.num_logits_rows(), 1)), adapter,
                   embeds ? std::min(pow2(std::max(in.num_embed_rows(), 1)), tp) : 0};
}

Status ProgramRunner::run_one(const StepInput& in, int adapter, StepOutput* out, const std::vector<int32_t>& dst_rows) {
  const int T = in.num_tokens, S = in.num_seqs, R = in.num_logits_rows(), V = config_.vocab_size;
  const int bs = config_.block_size;
  const BucketKey key = bucket_key(in, adapter);
  const int tp = key.T, pad = tp - T, pad_table = (pad + bs - 1) / bs;
  SG_CHECK(pad <= kMaxPad && pad_table <= config_.pad_blocks, StatusCode::kInternal,
           str_cat("a step of ", T, " tokens pads by ", pad, ", more than the scratch blocks hold"), "");
  Bucket* b = nullptr;
  SG_RETURN_IF_ERROR(bucket(key, &b));

  // The host image of the inputs, then one copy up.
  int32_t* h = b->host.data();
  int32_t* ids = h + b->off[kIds];
  int32_t* pos = h + b->off[kPos];
  int32_t* slots = h + b->off[kSlots];
  int32_t* tables = h + b->off[kTables];
  int32_t* cu = h + b->off[kCuQ];
  int32_t* ctx = h + b->off[kCtx];
  int32_t* rows = h + b->off[kRows];
  std::copy_n(in.token_ids.data(), T, ids);
  std::copy_n(in.positions.data(), T, pos);
  std::copy_n(in.slot_mapping.data(), T, slots);
  std::fill(ids + T, ids + tp, 0);
  std::fill_n(tables, int64_t{key.S} * key.B, -1);
  for (int s = 0; s < S; ++s) {
    std::copy_n(in.block_tables.data() + static_cast<ptrdiff_t>(s) * in.max_blocks_per_seq, in.max_blocks_per_seq,
                tables + static_cast<ptrdiff_t>(s) * key.B);
  }
  std::copy_n(in.cu_q.data(), S + 1, cu);
  std::fill(cu + S + 1, cu + key.S + 1, tp);
  std::copy_n(in.context_lens.data(), S, ctx);
  std::fill(ctx + S, ctx + key.S, 0);
  int32_t* states = h + b->off[kStates];
  std::fill_n(states, key.S, -1);
  if (!in.state_slots.empty()) std::copy_n(in.state_slots.data(), S, states);
  if (pad) {  // the padding sequence: its own scratch blocks at the end of the cache
    const int scratch = config_.num_blocks * bs;
    for (int i = 0; i < pad; ++i) {
      pos[T + i] = i;
      slots[T + i] = scratch + i;
    }
    for (int j = 0; j < pad_table; ++j) tables[static_cast<ptrdiff_t>(S) * key.B + j] = config_.num_blocks + j;
    ctx[S] = pad;
  }
  std::copy_n(in.logits_rows.data(), R, rows);
  std::fill(rows + R, rows + key.R, 0);
  {  // each row's sample op parameters (float bits); none given, or a padding row: temperature 0
    int32_t* sp = h + b->off[kSampleParams];
    std::fill_n(sp, int64_t{key.R} * kSampleParamCols, 0);
    if (!in.sample_params.empty()) std::memcpy(sp, in.sample_params.data(), in.sample_params.size() * sizeof(float));
  }
  const Device host{};
  if (key.E > 0) {  // the embedding rows and their token rows (padding: -1), kv_limit (padding: causal)
    const int E = in.num_embed_rows();
    SG_CHECK(E == 0 || in.embed_width == config_.hidden_size, StatusCode::kInvalidArgument,
             str_cat("a step's embedding rows have width ", in.embed_width, "; the model's hidden size is ",
                     config_.hidden_size), "");
    int32_t* index = h + b->off[kEmbedIndex];
    std::copy_n(in.embed_index.data(), E, index);
    std::fill(index + E, index + key.E, -1);
    std::copy_n(in.embed_rows.data(), static_cast<size_t>(E) * config_.hidden_size, b->host_rows.data());
    int32_t* limit = h + b->off[kKvLimit];
    if (in.kv_limit.empty()) {
      std::copy_n(pos, T, limit);
    } else {
      std::copy_n(in.kv_limit.data(), T, limit);
    }
    std::copy(pos + T, pos + tp, limit + T);
    SG_RETURN_IF_ERROR(copy_raw(b->rows.get(), config_.device, b->host_rows.data(), host, DType::kF32,
                                static_cast<int64_t>(E) * config_.hidden_size));
  }
  SG_RETURN_IF_ERROR(copy_raw(b->inputs.get(), config_.device, h, host, DType::kI32, static_cast<int64_t>(b->host.size())));

  SG_RETURN_IF_ERROR(b->program->run());

  Tensor logits, tokens;
  SG_RETURN_IF_ERROR(b->program->buffer(b->logits_id, &logits));
  SG_RETURN_IF_ERROR(b->program->buffer(b->token_id, &tokens));
  std::vector<int32_t> tk(R);
  SG_RETURN_IF_ERROR(copy_raw(tk.data(), host, tokens.data, tokens.device, DType::kI32, R));
  auto dst = [&](int r) { return dst_rows.empty() ? r : dst_rows[r]; };
  for (int r = 0; r < R; ++r) {
    out->tokens[dst(r)] = tk[r];
    last_rows_[dst(r)] = {b, r};
  }
  if (in.device_logprobs) {  // the rows' raw logprobs and ranks beside their tokens
    Tensor lp, rank;
    SG_RETURN_IF_ERROR(b->program->buffer(b->logprob_id, &lp));
    SG_RETURN_IF_ERROR(b->program->buffer(b->rank_id, &rank));
    std::vector<float> lps(R);
    std::vector<int32_t> rks(R);
    SG_RETURN_IF_ERROR(copy_raw(lps.data(), host, lp.data, lp.device, DType::kF32, R));
    SG_RETURN_IF_ERROR(copy_raw(rks.data(), host, rank.data, rank.device, DType::kI32, R));
    for (int r = 0; r < R; ++r) {
      out->logprobs[dst(r)] = lps[r];
      out->ranks[dst(r)] = rks[r];
    }
  }

  // Logits rows: the program's own buffer when it is host float32 and nothing is remapped,
  // else the rows the engine reads, converted into logits_.
  if (config_.device.is_cpu() && logits.dtype == DType::kF32 && dst_rows.empty()) {
    out->logits = Tensor::view_of(logits.data, DType::kF32, {R, V});
    return Status::OK();
  }
  std::vector<int> want;
  for (int r = 0; r < R; ++r) {
    if (in.need_logits.empty() || in.need_logits[r]) want.push_back(r);
  }
  if (want.empty()) return Status::OK();
  float* out_rows = logits_rows(dst_rows.empty() ? R : static_cast<int64_t>(out->tokens.size()));
  const size_t es = dtype_size(logits.dtype);
  const auto* src = static_cast<const char*>(logits.data);
  const char* host_rows = src;  // where the wanted rows are readable on the host
  std::vector<int64_t> at(R, -1);  // row r's index within host_rows
  if (!logits.device.is_cpu()) {
    // All rows in one transfer when most are wanted, else one transfer per row.
    const bool whole = want.size() * 2 >= static_cast<size_t>(R);
    const size_t n_rows = whole ? R : want.size();
    staging_.resize(n_rows * V * es);
    if (whole) {
      SG_RETURN_IF_ERROR(copy_raw(staging_.data(), host, src, logits.device, logits.dtype, int64_t{R} * V));
      for (int r : want) at[r] = r;
    } else {
      for (size_t i = 0; i < want.size(); ++i) {
        SG_RETURN_IF_ERROR(copy_raw(staging_.data() + i * V * es, host, src + int64_t{want[i]} * V * es, logits.device,
                                    logits.dtype, V));
        at[want[i]] = static_cast<int64_t>(i);
      }
    }
    host_rows = reinterpret_cast<const char*>(staging_.data());
  } else {
    for (int r : want) at[r] = r;
  }
  parallel_for(0, static_cast<int64_t>(want.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int r = want[i];
      convert(host_rows + at[r] * V * es, logits.dtype, out_rows + int64_t{dst(r)} * V, DType::kF32, V);
    }
  });
  return Status::OK();
}

Status ProgramRunner::sample_masked(const MaskedRows& in, StepOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t V = config_.vocab_size, W = (V + 31) / 32, n_all = static_cast<int64_t>(in.rows.size());
  SG_CHECK(in.words == W && static_cast<int64_t>(in.masks.size()) == n_all &&
               static_cast<int64_t>(in.sample_params.size()) == n_all * kSampleParamCols,
           StatusCode::kInvalidArgument,
           str_cat("sample_masked: ", n_all, " rows with ", in.masks.size(), " masks of ", in.words, " words and ",
                   in.sample_params.size(), " params (want ", W, " words and 8 params a row)"),
           "give one mask of ceil(V / 32) words and one params row per row");
  const int64_t R = static_cast<int64_t>(last_rows_.size());
  SG_CHECK(static_cast<int64_t>(out->tokens.size()) == R &&
               (!in.logprobs || (static_cast<int64_t>(out->logprobs.size()) == R &&
                                 static_cast<int64_t>(out->ranks.size()) == R)),
           StatusCode::kInvalidArgument, "sample_masked: the StepOutput is not the last run()'s",
           "call it after run(), with that step's output (device_logprobs set when logprobs are asked)");
  std::map<Bucket*, std::vector<int64_t>> groups;  // bucket -> indices into in.rows
  for (int64_t i = 0; i < n_all; ++i) {
    const int r = in.rows[i];
    SG_CHECK(r >= 0 && r < R && last_rows_[r].first != nullptr, StatusCode::kInvalidArgument,
             str_cat("sample_masked: row ", r, " is not a logits row of the last step (", R, " rows)"), "");
    groups[last_rows_[r].first].push_back(i);
  }
  const Device host{};
  for (auto& [b, idx] : groups) {
    int lo = INT32_MAX, hi = -1;
    for (int64_t i : idx) {
      lo = std::min(lo, last_rows_[in.rows[i]].second);
      hi = std::max(hi, last_rows_[in.rows[i]].second + 1);
    }
    const int64_t n = hi - lo, RB = b->key.R;
    if (b->masked == nullptr) {
      b->masked_out = RB * (kSampleParamCols + W);
      const size_t bytes = static_cast<size_t>(b->masked_out + 3 * RB) * sizeof(int32_t);
      if (config_.device.is_cpu() || !allocate_host(bytes, true, &b->masked_host).ok()) {
        SG_RETURN_IF_ERROR(allocate_host(bytes, false, &b->masked_host));
      }
      SG_RETURN_IF_ERROR(allocate(config_.device, bytes, &b->masked));
    }
    // The host image: the given rows; the rows between them temperature 0, every token allowed.
    int32_t* h = static_cast<int32_t*>(b->masked_host.get());
    int32_t* masks = h + n * kSampleParamCols;
    std::vector<uint8_t> given(n, 0);
    for (int64_t i : idx) {
      const int64_t j = last_rows_[in.rows[i]].second - lo;
      given[j] = 1;
      std::memcpy(h + j * kSampleParamCols, in.sample_params.data() + i * kSampleParamCols,
                  kSampleParamCols * sizeof(float));
      std::memcpy(masks + j * W, in.masks[i], W * sizeof(uint32_t));
    }
    for (int64_t j = 0; j < n; ++j) {
      if (given[j]) continue;
      std::fill_n(h + j * kSampleParamCols, kSampleParamCols, 0);
      std::fill_n(masks + j * W, W, -1);
    }
    auto* dev = static_cast<int32_t*>(b->masked.get());
    SG_RETURN_IF_ERROR(copy_raw(dev, config_.device, h, host, DType::kI32, n * (kSampleParamCols + W)));
    Tensor logits;
    SG_RETURN_IF_ERROR(b->program->buffer(b->logits_id, &logits));
    int32_t* o = dev + b->masked_out;
    const std::vector<Tensor> ins = {
        logits.slice0(lo, n), Tensor::view_of(dev, DType::kF32, {n, kSampleParamCols}, config_.device, b->masked),
        Tensor::view_of(dev + n * kSampleParamCols, DType::kI32, {n, W}, config_.device, b->masked)};
    const std::vector<Tensor> outs = {Tensor::view_of(o, DType::kI32, {n}, config_.device, b->masked),
                                      Tensor::view_of(o + RB, DType::kF32, {n}, config_.device, b->masked),
                                      Tensor::view_of(o + 2 * RB, DType::kI32, {n}, config_.device, b->masked)};
    SG_RETURN_IF_ERROR(OpRegistry::global().call("sample", ins, outs, Attrs{}));
    int32_t* back = h + b->masked_out;  // token, logprob, rank [RB] each
    // One transfer: the tokens, or through the ranks (logprob, rank at RB and 2 RB).
    SG_RETURN_IF_ERROR(copy_raw(back, host, o, config_.device, DType::kI32, in.logprobs ? 2 * RB + n : n));
    for (int64_t i : idx) {
      const int r = in.rows[i];
      const int64_t j = last_rows_[r].second - lo;
      out->tokens[r] = back[j];
      if (in.logprobs) {
        std::memcpy(&out->logprobs[r], back + RB + j, sizeof(float));
        out->ranks[r] = back[2 * RB + j];
      }
    }
  }
  return Status::OK();
}

}  // namespace surogate::serve
