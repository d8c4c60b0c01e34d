// GradReducer: a data-parallel rank's gradient reductions on a communication thread of their
// own, so that they overlap the backward pass (the ops grad_reduce / grad_wait, cpu/grad_reduce.cpp;
// the placement: surogate/compile/grad_reduce.py; the design: surogate/train/data_parallel.py).
//
// The reducer holds a Communicator of a group of its own (the rank's other collectives, ZeRO-3's
// weight gathers, go on meanwhile through the Program's communicator: the groups never share a
// rendezvous). start() queues one reduction (a layer's gradient accumulators: all-reduced, or
// reduced to their owners) and returns; the thread runs them one after the other in the order they
// were started, which is program order, the same on every rank, as collectives need. wait() returns
// when every started reduction is done (the first error, if any), with their results in place.
//
// Only an armed reducer reduces (arm(): the rank's last backward of the step, so that each
// accumulator is reduced once, holding every micro-batch: the bucketed path's numbers); wait()
// disarms it and counts the step. A staged reduction (ZeRO-2/3 with gradient sharding: the
// accumulators of a layer a rank does not own live in a staging buffer) runs every backward, and
// afterwards zeroes this rank's tensors that it does not own (the staging, for the next layer or
// micro-batch); wait_for(tag) waits for the last reduction of that tag only (a staging buffer's
// previous layer). Events (start, begin, end, wait, each with its tag and a
// steady-clock time in ns) are recorded when asked, for tests of the overlap.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/collective.h"

namespace surogate::dist {

class GradReducer {
 public:
  struct Event {
    std::string kind;  // "start" (queued by grad_reduce), "begin", "end" (on the thread), "wait"
    int64_t tag = -1;  // the reduction's (its decoder layer; -1 outside the layers)
    int64_t ns = 0;  // std::chrono::steady_clock, comparable among the ranks of one process
  };

  explicit GradReducer(std::shared_ptr<Communicator> comm);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  Communicator& comm() { return *comm_; }
  void arm(bool on);
  bool armed() const;
  // Queue bufs' reduction: owners empty, an all-reduce (sum); else bufs[i] to rank owners[i].
  // zero_others (owners given): afterwards, the tensors of other ranks are zeroed here.
  Status start(std::vector<Tensor> bufs, std::vector<int> owners, int64_t tag, bool zero_others = false);
  // Every started reduction done; armed, disarms and counts a step.
  Status wait();
  // The last reduction started with `tag` done (none started: at once).
  Status wait_for(int64_t tag);
  // Steps reduced (waits that found reductions) since the last call.
  int64_t take_steps();
  void set_recording(bool on);
  std::vector<Event> events() const;
  // The reducer's group fails every pending and later call (a rank failed).
  void abort(const std::string& why) { comm_->abort(why); }

 private:
  struct Job {
    std::vector<Tensor> bufs;
    std::vector<int> owners;
    int64_t tag = -1;
    bool zero_others = false;
  };
  void loop();
  void record(const char* kind, int64_t tag);  // with mu_ held

  std::shared_ptr<Communicator> comm_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false, stop_ = false, armed_ = false, recording_ = false;
  int64_t started_ = 0, done_ = 0, steps_ = 0;  // started_, done_: reductions since construction
  std::map<int64_t, int64_t> last_of_;  // tag -> the started_ count of its last reduction
  Status error_;
  std::vector<Event> events_;
  std::thread thread_;
};

}  // namespace surogate::dist
