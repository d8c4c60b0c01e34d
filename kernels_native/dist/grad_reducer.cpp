#include "dist/grad_reducer.h"

#include <chrono>

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

Status GradReducer::start(std::vector<Tensor> bufs, std::vector<int> owners, int64_t tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    SG_RETURN_IF_ERROR(error_);
    record("start", tag);
    queue_.push_back(Job{std::move(bufs), std::move(owners), tag});
    ++started_;
  }
  cv_.notify_all();
  return Status::OK();
}

Status GradReducer::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  record("wait", -1);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  armed_ = false;
  if (started_ > 0) ++steps_;
  started_ = 0;
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
    }
    job = Job{};  // the tensors' references dropped outside the lock
    lock.lock();
    record("end", tag);
    if (!st.ok() && error_.ok()) error_ = st;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace surogate::dist
