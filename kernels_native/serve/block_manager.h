// BlockManager: the paged KV cache's bookkeeping. The cache is num_blocks blocks of block_size
// token slots; a sequence's block table lists the blocks that hold its tokens in order, so
// token position p lives in slot block_table[p / block_size] * block_size + p % block_size.
//
// Prefix caching: a FULL block is known by a hash chained over the previous block's hash and its
// own token ids, so equal hashes mean equal prefixes (the tokens and the parent hash are compared
// too, against collisions). A block is registered only after its KV has been computed
// (cache_computed_blocks, called once a step has run), so a request can never reuse a block that
// a chunked prefill has not filled yet. Blocks are reference counted; a block whose count drops
// to 0 keeps its contents and stays findable (evictable, in LRU order) until a fresh allocation
// needs its memory; never-registered free blocks are handed out first.
//
// Embedding spans (Sequence::embeds): a block's tokens at a span's positions are placeholders
// whose first-layer input is the span's rows, so the block's hash also takes the digest of every
// span its tokens overlap with the offsets into it (the same placeholders with another image
// never share a block, the same image does); the digest is stored and compared on lookup like
// the tokens. A hit that would end inside a bidirectional span backs off to the block holding
// the span's start: the span is always computed whole, in one step.
//
// The verb pairs: can_allocate / allocate (all tokens of a waiting sequence, reusing its cached
// prefix), can_append / may_append (the next block(s) of a running sequence), trim, deallocate.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "serve/sequence.h"

namespace surogate::serve {

struct BlockManagerStats {
  int num_blocks = 0;
  int used = 0;    // referenced by a running sequence
  int free = 0;    // allocatable: never used, or cached with no reference
  int cached = 0;  // of the free ones, those still holding a findable prefix
  double kv_usage = 0.0;
  int64_t prefix_cache_queries = 0;  // tokens looked up at allocation
  int64_t prefix_cache_hits = 0;     // of those, tokens served from the cache
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  int blocks_for(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  bool can_allocate(Sequence& seq);
  void allocate(Sequence& seq);
  // `lookahead`: slots past the sequence's tokens for draft tokens (speculative decoding).
  bool can_append(const Sequence& seq, int lookahead = 0) const;
  void may_append(Sequence& seq, int lookahead = 0);
  // Give back the blocks past what seq's tokens need (taken for draft tokens that were
  // rejected); such blocks are never registered in the prefix cache.
  void trim(Sequence& seq);
  void cache_computed_blocks(Sequence& seq);
  void deallocate(Sequence& seq);
  // A draft model's KV (draft_proposer.h) lives at the same block ids in its own memory: the
  // leading blocks of seq that it holds for seq's own tokens (draft_computed) are marked, so a
  // later prefix-cache hit on them starts its draft_computed there (allocate) instead of at 0.
  void mark_drafted(const Sequence& seq);
  int num_free_blocks() const { return num_free(); }

  BlockManagerStats stats() const;
  // Forget every cached prefix (the KV memory was released or rewritten): registered free blocks
  // become plain free blocks, blocks in use keep their contents for their sequences but are no
  // longer findable. Returns how many blocks left the cache.
  int reset_prefix_cache();

 private:
  struct Block {
    int ref_count = 0;
    bool has_hash = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // of a registered block: compared on lookup
    uint64_t embed_digest = 0;    // of the embedding spans its tokens overlap (0: none), compared too
    bool drafted = false;         // the draft model's KV of its tokens is there too (mark_drafted)
    std::list<int>::iterator lru_pos;
  };

  void hash_full_blocks(Sequence& seq) const;
  // Leading full blocks of seq found in the cache (at most (num_tokens - 1) / block_size: the
  // last token is always computed, to get its logits).
  std::vector<int> find_cached_prefix(Sequence& seq);
  void claim(int block_id);
  int take_free_block();
  int num_free() const { return static_cast<int>(free_.size() + evictable_.size()); }

  int block_size_;
  bool enable_prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int> free_;     // ref_count 0, not registered
  std::list<int> evictable_;  // ref_count 0, registered; front = least recently used
  std::unordered_map<uint64_t, int> cached_;  // hash -> block id
  int num_used_ = 0;
  int64_t queries_ = 0;
  int64_t hits_ = 0;
};

}  // namespace surogate::serve
