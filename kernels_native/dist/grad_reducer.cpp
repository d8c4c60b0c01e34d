#include "dist/grad_reducer.h"

#include <chrono>
#include <cstring>

namespace surogate::dist {

GradReducer::GradReducer(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
  thread_ = std::thread([this] { loop(); });
}

GradReducer::~GradReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradReducer::arm(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = on;
}

bool GradReducer::armed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return armed_;
}

void GradReducer::record(const char* kind, int64_t tag) {
  if (!recording_) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
  events_.push_back(Event{kind, tag, static_cast<int64_t>(ns)});
}

Status GradReducer::start(std::vector<Tensor> bufs, std::vector<int> owners, int64_t tag, bool zero_others) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    SG_RETURN_IF_ERROR(error_);
    record("start", tag);
    queue_.push_back(Job{std::move(bufs), std::move(owners), tag, zero_others});
    last_of_[tag] = ++started_;
  }
  cv_.notify_all();
  return Status::OK();
}

Status GradReducer::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  record("wait", -1);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (armed_) ++steps_;
  armed_ = false;
  return error_;
}

Status GradReducer::wait_for(int64_t tag) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = last_of_.find(tag);
  const int64_t until = it == last_of_.end() ? 0 : it->second;
  cv_.wait(lock, [&] { return done_ >= until || !error_.ok(); });
  return error_;
}

int64_t GradReducer::take_steps() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = steps_;
  steps_ = 0;
  return n;
}

void GradReducer::set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
  events_.clear();
}

std::vector<GradReducer::Event> GradReducer::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void GradReducer::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const int64_t tag = job.tag;
    const bool failed = !error_.ok();
    record("begin", tag);
    lock.unlock();
    Status st;
    if (!failed) {  // after a failure the group is aborted: the rest are dropped, wait() reports the first
      st = job.owners.empty() ? comm_->all_reduce(job.bufs, ReduceOp::kSum)
                              : comm_->reduce_to_owners(job.bufs, job.owners, ReduceOp::kSum);
      if (st.ok() && job.zero_others) {  // (host memory: the threads backend's ranks are CPU ranks)
        for (size_t i = 0; i < job.bufs.size(); ++i) {
          if (job.owners[i] != comm_->rank()) std::memset(job.bufs[i].data, 0, job.bufs[i].nbytes());
        }
      }
    }
    job = Job{};  // the tensors' references dropped outside the lock
    lock.lock();
    record("end", tag);
    if (!st.ok() && error_.ok()) error_ = st;
    ++done_;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace surogate::dist
