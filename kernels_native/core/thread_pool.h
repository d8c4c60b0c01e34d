// The CPU thread pool. parallel_for splits [begin, end) into chunks of at least `grain`
// iterations and runs them on the pool's workers and the calling thread. A parallel_for
// issued from inside a worker runs inline (no nested parallelism); calls from several outside
// threads take turns.
#pragma once

#include <cstdint>
#include <functional>

namespace surogate {

// fn(lo, hi) handles iterations [lo, hi).
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

int num_threads();
// Resize the pool (n >= 1). Takes effect for the next parallel_for.
void set_num_threads(int n);

}  // namespace surogate
