#include "serve/block_manager.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace surogate::serve {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t block_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < n; ++i) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x632be59bd9b4e019ULL));
  return h;
}

constexpr uint64_t kRootHash = 0x5eed5eed5eed5eedULL;

// The embedding spans block i of seq overlaps: each one's digest, where the overlap starts in the
// block and in the span, and its length. 0 when the block holds no span position.
uint64_t embed_digest(const Sequence& seq, int i, int bs) {
  uint64_t h = 0;
  const int lo = i * bs, hi = lo + bs;
  for (const EmbedSpan& e : seq.embeds) {
    if (e.start >= hi) break;
    if (e.end() <= lo) continue;
    const int a = std::max(lo, e.start), b = std::min(hi, e.end());
    h = mix64(h ^ e.digest);
    h = mix64(h ^ ((static_cast<uint64_t>(a - lo) << 40) ^ (static_cast<uint64_t>(a - e.start) << 8) ^
                   static_cast<uint64_t>(b - a)) ^ (e.bidirectional ? 0x8000000000000000ULL : 0));
  }
  return h;
}

// The parent of a sequence's first block: the same tokens under another LoRA adapter hold other
// keys and values, so each adapter (and the base model, -1) has its own chain of hashes.
uint64_t root_hash(const Sequence& seq) {
  return seq.adapter_id < 0 ? kRootHash : mix64(kRootHash ^ (static_cast<uint64_t>(seq.adapter_id) + 1));
}

}  // namespace

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), enable_prefix_caching_(enable_prefix_caching), blocks_(num_blocks) {
  assert(num_blocks > 0 && block_size > 0);
  free_.reserve(num_blocks);
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);  // hand out block 0 first
}

void BlockManager::hash_full_blocks(Sequence& seq) const {
  const int full = seq.num_tokens() / block_size_;
  auto& hashes = seq.block_hashes;
  while (static_cast<int>(hashes.size()) < full) {
    const int i = static_cast<int>(hashes.size());
    const uint64_t parent = i == 0 ? root_hash(seq) : hashes[i - 1];
    uint64_t h = block_hash(parent, seq.token_ids.data() + static_cast<size_t>(i) * block_size_, block_size_);
    if (const uint64_t d = embed_digest(seq, i, block_size_)) h = mix64(h ^ d);
    hashes.push_back(h);
  }
}

std::vector<int> BlockManager::find_cached_prefix(Sequence& seq) {
  std::vector<int> hits;
  if (!enable_prefix_caching_ || seq.wants_prompt_logprobs()) return hits;  // those rows must be computed
  hash_full_blocks(seq);
  const int max_blocks = (seq.num_tokens() - 1) / block_size_;
  for (int i = 0; i < max_blocks; ++i) {
    auto it = cached_.find(seq.block_hashes[i]);
    if (it == cached_.end()) break;
    const Block& b = blocks_[it->second];
    const uint64_t parent = i == 0 ? root_hash(seq) : seq.block_hashes[i - 1];
    const int32_t* tokens = seq.token_ids.data() + static_cast<size_t>(i) * block_size_;
    if (b.parent_hash != parent || std::memcmp(b.tokens.data(), tokens, sizeof(int32_t) * block_size_) != 0 ||
        b.embed_digest != embed_digest(seq, i, block_size_)) {
      break;
    }
    hits.push_back(it->second);
  }
  // Never end inside a bidirectional span: back off to the block where it starts.
  while (!hits.empty()) {
    const EmbedSpan* span = seq.bidirectional_span_across(static_cast<int>(hits.size()) * block_size_);
    if (span == nullptr) break;
    hits.resize(span->start / block_size_);
  }
  return hits;
}

bool BlockManager::can_allocate(Sequence& seq) {
  int hits_in_use = 0;
  for (int b : find_cached_prefix(seq)) hits_in_use += blocks_[b].ref_count > 0;
  return blocks_for(seq.num_tokens()) - hits_in_use <= num_free();
}

void BlockManager::allocate(Sequence& seq) {
  assert(seq.block_table.empty());
  const std::vector<int> hits = find_cached_prefix(seq);
  for (int b : hits) {  // claim the hits first, so that taking fresh blocks cannot evict them
    claim(b);
    seq.block_table.push_back(b);
  }
  const int needed = blocks_for(seq.num_tokens());
  while (static_cast<int>(seq.block_table.size()) < needed) seq.block_table.push_back(take_free_block());
  seq.num_registered_blocks = static_cast<int>(hits.size());
  seq.num_cached_tokens = static_cast<int>(hits.size()) * block_size_;
  seq.num_computed_tokens = seq.num_cached_tokens;
  size_t drafted = 0;
  while (drafted < hits.size() && blocks_[hits[drafted]].drafted) ++drafted;
  seq.draft_computed = static_cast<int>(drafted) * block_size_;
  if (enable_prefix_caching_) {
    queries_ += seq.num_tokens();
    hits_ += seq.num_cached_tokens;
  }
}

void BlockManager::mark_drafted(const Sequence& seq) {
  const int full = std::min({seq.draft_computed, seq.num_tokens(), static_cast<int>(seq.block_table.size()) * block_size_}) /
                   block_size_;
  for (int i = 0; i < full; ++i) blocks_[seq.block_table[i]].drafted = true;
}

bool BlockManager::can_append(const Sequence& seq, int lookahead) const {
  return blocks_for(seq.num_tokens() + lookahead) - static_cast<int>(seq.block_table.size()) <= num_free();
}

void BlockManager::may_append(Sequence& seq, int lookahead) {
  while (static_cast<int>(seq.block_table.size()) < blocks_for(seq.num_tokens() + lookahead)) {
    seq.block_table.push_back(take_free_block());
  }
}

void BlockManager::trim(Sequence& seq) {
  const int keep = std::max(blocks_for(seq.num_tokens()), seq.num_registered_blocks);
  while (static_cast<int>(seq.block_table.size()) > keep) {
    Block& b = blocks_[seq.block_table.back()];
    assert(b.ref_count == 1 && !b.has_hash);
    b.ref_count = 0;
    --num_used_;
    free_.push_back(seq.block_table.back());
    seq.block_table.pop_back();
  }
}

void BlockManager::cache_computed_blocks(Sequence& seq) {
  if (!enable_prefix_caching_) return;
  const int full = std::min(seq.num_computed_tokens / block_size_, static_cast<int>(seq.block_table.size()));
  if (full <= seq.num_registered_blocks) return;
  hash_full_blocks(seq);
  for (int i = seq.num_registered_blocks; i < full; ++i) {
    const uint64_t h = seq.block_hashes[i];
    // Another sequence computed the same block first (both prefilled at once): keep that one,
    // this copy is freed without a hash.
    if (cached_.count(h)) continue;
    Block& b = blocks_[seq.block_table[i]];
    assert(!b.has_hash && b.ref_count > 0);
    b.has_hash = true;
    b.hash = h;
    b.parent_hash = i == 0 ? root_hash(seq) : seq.block_hashes[i - 1];
    const int32_t* tokens = seq.token_ids.data() + static_cast<size_t>(i) * block_size_;
    b.tokens.assign(tokens, tokens + block_size_);
    b.embed_digest = embed_digest(seq, i, block_size_);
    cached_.emplace(h, seq.block_table[i]);
  }
  seq.num_registered_blocks = full;
}

void BlockManager::deallocate(Sequence& seq) {
  // Last blocks first: a sequence's tail is evicted before the prefix other requests may share.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    Block& b = blocks_[*it];
    assert(b.ref_count > 0);
    if (--b.ref_count > 0) continue;
    --num_used_;
    if (b.has_hash) {
      b.lru_pos = evictable_.insert(evictable_.end(), *it);
    } else {
      free_.push_back(*it);
    }
  }
  seq.block_table.clear();
  seq.num_registered_blocks = 0;
}

void BlockManager::claim(int block_id) {
  Block& b = blocks_[block_id];
  if (b.ref_count++ == 0) {
    evictable_.erase(b.lru_pos);
    ++num_used_;
  }
}

int BlockManager::take_free_block() {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    assert(!evictable_.empty() && "take_free_block without a can_allocate / can_append check");
    id = evictable_.front();
    evictable_.pop_front();
    Block& b = blocks_[id];
    cached_.erase(b.hash);
    b.has_hash = false;
    b.tokens.clear();
  }
  assert(blocks_[id].ref_count == 0);
  blocks_[id].ref_count = 1;
  blocks_[id].drafted = false;
  ++num_used_;
  return id;
}

int BlockManager::reset_prefix_cache() {
  const int dropped = static_cast<int>(cached_.size());
  for (int id : evictable_) free_.push_back(id);
  evictable_.clear();
  for (Block& b : blocks_) {
    b.has_hash = false;
    b.tokens.clear();
  }
  cached_.clear();
  return dropped;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks();
  s.used = num_used_;
  s.free = num_free();
  s.cached = static_cast<int>(evictable_.size());
  s.kv_usage = static_cast<double>(num_used_) / num_blocks();
  s.prefix_cache_queries = queries_;
  s.prefix_cache_hits = hits_;
  return s;
}

}  // namespace surogate::serve
