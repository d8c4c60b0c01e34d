#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace surogate {

namespace {

thread_local bool t_in_worker = false;

class ThreadPool {
 public:
  explicit ThreadPool(int n) { start(n); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    std::lock_guard<std::mutex> call(call_mu_);
    stop();
    start(n);
  }

  void run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> call(call_mu_);
    const int64_t n = end - begin;
    const int64_t max_chunks = static_cast<int64_t>(size()) * 4;
    int64_t chunk = std::max<int64_t>(grain, (n + max_chunks - 1) / max_chunks);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      begin_ = begin;
      end_ = end;
      chunk_ = chunk;
      next_.store(begin);
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    t_in_worker = true;
    work();
    t_in_worker = false;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void start(int n) {
    uint64_t current;
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = false;
      current = generation_;
    }
    // A new worker has seen every generation so far: starting it at 0 after a resize would wake it for the
    // last (finished) run, and its extra decrement of pending_ could let a later run return while another
    // worker is still inside that run's fn.
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this, current] { loop(current); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  void work() {
    for (;;) {
      int64_t lo = next_.fetch_add(chunk_);
      if (lo >= end_) break;
      (*fn_)(lo, std::min(end_, lo + chunk_));
    }
  }

  void loop(uint64_t seen) {
    t_in_worker = true;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
      }
      work();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

int default_threads() {
  // SUROGATE_NUM_THREADS is a debug switch; the default is every hardware thread.
  if (const char* env = std::getenv("SUROGATE_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool* p = new ThreadPool(default_threads());  // never destroyed: workers outlive statics
  return *p;
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  if (t_in_worker || end - begin <= grain || pool().size() == 1) {
    fn(begin, end);
    return;
  }
  pool().run(begin, end, grain, fn);
}

int num_threads() { return pool().size(); }
void set_num_threads(int n) { pool().resize(std::max(1, n)); }

}  // namespace surogate
