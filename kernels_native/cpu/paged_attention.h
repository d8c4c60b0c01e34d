// What cpu/paged_attention.cpp shares with the other CPU ops that write the paged KV cache
// (qkv_rope_cache): the check of a step's slot mapping. The cache layout is written down there.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace surogate::cpu {

// Every slot of slots[0, T) is -1 (skip the token) or in [0, num_blocks * block_size), and no
// two tokens share a slot; the error names `op` and the token. Call it before writing anything.
Status check_slot_mapping(const char* op, const int32_t* slots, int64_t T, int64_t num_blocks, int64_t block_size);

}  // namespace surogate::cpu
