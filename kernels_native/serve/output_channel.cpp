#include "serve/output_channel.h"

#include <chrono>

namespace surogate::serve {

void OutputChannel::push(std::vector<RequestOutput>&& batch) {
  if (batch.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (RequestOutput& o : batch) queue_.push_back(std::move(o));
  }
  cv_.notify_all();
}

std::vector<RequestOutput> OutputChannel::poll(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !queue_.empty() || closed_; };
  if (timeout_s < 0) {
    cv_.wait(lock, ready);
  } else if (timeout_s > 0) {
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  }
  std::vector<RequestOutput> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

void OutputChannel::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool OutputChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace surogate::serve
