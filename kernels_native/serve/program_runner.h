// ProgramRunner: the ModelRunner of a compiled model, stepping with no Python in between.
//
// Programs have fixed shapes and steps do not, so a step is padded up to a bucket
// (tokens T, sequences S, block-table width B, logits rows R, LoRA adapter) and run by that
// bucket's Program, compiled on first use through a callback (the Python compiler, with the GIL)
// and reused after:
//   tokens: exact up to 16 (decode batches), then multiples of 16 up to 256, then of 256;
//     the padding tokens form one extra sequence that writes and reads scratch blocks at the end
//     of the cache ([num_blocks, num_blocks + pad_blocks), never handed out by the engine);
//   sequences: a power of two; padding sequences have no queries and an empty context;
//   block-table width and logits rows: powers of two (padding rows read row 0, dropped);
//   embedding rows E: 0 for a step without any (its Program has no embed inputs), else a power of
//     two up to T (padding entries have index -1); such a Program also takes kv_limit [T].
//
// A bucket's step inputs (input_ids, position_ids, slot_mapping, block_tables, cu_q,
// context_lens, logits_rows, and state_slots where the model keeps per-sequence state, embed_index
// and kv_limit where the step has embedding rows: all int32; padding sequences have slot -1; then
// sample_params, float32 [R, 8], the padding rows' temperature 0) live in one buffer on the
// Program's device, bound here, filled on the host and copied up in one transfer; the embedding
// rows (float32 [E, hidden]) in a second one. The Program computes `logits` [R, V] and ends in
// the `sample` op (KVCache(sample=True)): `sampled` [R] (int32: the argmax at temperature 0, else
// the row's draw), `sampled.logprob` and `sampled.rank`. The tokens come back every step, the
// logprobs and ranks when a row takes its logprob from the device (StepInput::device_logprobs),
// logits rows only where the engine needs them (StepInput::need_logits), converted to float32 on
// the host. On the CPU the buffers are host memory and float32 logits are returned without a copy.
//
// A step whose sequences use several adapters (or the base model, -1) runs as one sub-step per
// adapter, each through its adapter's Program; each sequence's KV writes and reads are its own,
// so splitting changes no result.
//
// Decoder layers whose weights stay in host memory (--cpu-offload-gb, surogate/serve/offload.py)
// need nothing here: each bucket's Program carries the copies as weight_fetch / weight_wait
// instructions, bound by the compile callback to the host packs and the two staging buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "runtime/program.h"
#include "serve/model_runner.h"

namespace surogate::serve {

struct BucketKey {
  int T = 0, S = 0, B = 0, R = 0, adapter = -1, E = 0;
  bool operator<(const BucketKey& o) const {
    return std::tie(T, S, B, R, adapter, E) < std::tie(o.T, o.S, o.B, o.R, o.adapter, o.E);
  }
};

class ProgramRunner : public ModelRunner {
 public:
  struct Config {
    Device device;
    int vocab_size = 0;
    int block_size = 16;
    int num_blocks = 0;  // what the engine hands out
    int pad_blocks = 0;  // scratch blocks after them, for padding tokens
    int hidden_size = 0;  // the width of embedding rows (0: the runner takes none)
  };
  // compile(key, &program, &owner): the Program of a bucket, its weights and KV cache bound, its
  // step inputs left for this runner to bind; `owner` keeps it (and what it reads) alive while
  // the runner holds it.
  using CompileFn = std::function<Status(const BucketKey&, Program** out, std::shared_ptr<void>* owner)>;

  static constexpr int kSmallT = 16;
  static constexpr int kMaxPad = 256;  // padding tokens never exceed this

  ProgramRunner(const Config& config, CompileFn compile);

  Status run(const StepInput& in, StepOutput* out) override;
  int vocab_size() const override { return config_.vocab_size; }
  int hidden_size() const override { return config_.hidden_size; }
  bool samples_on_device() const override { return true; }
  bool masks_on_device() const override { return true; }
  // The `sample` op with the grammar masks over rows of the last run()'s logits, still in its
  // Programs' buffers (each bucket's rows in one call; rows between them drawn unmasked at
  // temperature 0 and dropped): only the tokens (logprobs, ranks) come back.
  Status sample_masked(const MaskedRows& in, StepOutput* out) override;

  // Drop the Programs of one adapter (-2: all), e.g. before the caller re-registers it.
  void forget(int adapter);
  int num_programs() const;

  static int bucket_tokens(int t);
  // The bucket a step (of one adapter) runs in.
  BucketKey bucket_key(const StepInput& in, int adapter) const;

 private:
  struct Bucket {
    Program* program = nullptr;
    std::shared_ptr<void> owner;
    BucketKey key;
    std::shared_ptr<void> inputs;   // the packed int32 inputs on the program's device
    std::vector<int32_t> host;      // their host image (sample_params: float bits)
    int64_t off[11] = {};           // element offset of each input in both
    std::shared_ptr<void> rows;     // the embedding rows [E, hidden] f32 on the device (E > 0)
    std::vector<float> host_rows;   // their host image
    int logits_id = -1, token_id = -1, logprob_id = -1, rank_id = -1;  // the program's outputs
    // sample_masked's buffer on the device (int32): params [n, 8], masks [n, W] (n <= R), then
    // token, logprob, rank [R] at masked_out; its host image (page-locked on a GPU: the masks,
    // ~19 KB a row at V = 151,936, go up every step).
    std::shared_ptr<void> masked, masked_host;
    int64_t masked_out = 0;
  };

  Status bucket(const BucketKey& key, Bucket** out);
  // One adapter's step; its logits rows land at out rows dst_rows[r] (identity when empty).
  Status run_one(const StepInput& in, int adapter, StepOutput* out, const std::vector<int32_t>& dst_rows);
  float* logits_rows(int64_t R);

  Config config_;
  CompileFn compile_;
  mutable std::mutex mu_;  // guards buckets_ against forget() from another thread
  std::map<BucketKey, std::unique_ptr<Bucket>> buckets_;
  std::vector<float> logits_;          // host float32 [R, V]
  std::vector<uint8_t> staging_;       // device logits rows on their way to float32
  std::vector<std::pair<Bucket*, int>> last_rows_;  // the last run()'s rows: bucket, row in it
};

}  // namespace surogate::serve
