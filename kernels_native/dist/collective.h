// Collectives among the ranks of one data-parallel group: the interface the trainer's gradient
// all-reduce and ZeRO sharding speak, whatever moves the bytes (the threads backend below, NCCL
// on GPUs).
//
// One Communicator per rank. Every call is collective: all ranks of the group make the same
// calls in the same order, with tensors of the same count, sizes and dtypes (a rank whose call
// does not match fails, and so do all the others, with a Status naming the first difference).
// Calls block until the group's data has moved; the caller's tensors may be reused on return.
//
// Results are deterministic and the same on every rank: a reduction adds the ranks' values in
// rank order (0, 1, ..., R-1) in f32, whatever the thread timing, so replicas that start equal
// stay bit-identical. bf16 / f16 tensors are accumulated in f32 and rounded once.
//
// A bucket is a list of tensors moved in one call (the gradients of several parameters). The
// "owner" calls are ZeRO's over whole tensors: tensor i of a bucket belongs to rank owners[i]
// (a reduce-scatter and an all-gather whose pieces are tensors of any size).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace surogate::dist {

enum class ReduceOp { kSum, kMean };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend() const = 0;

  // In place: every rank's bufs[i] becomes the reduction over ranks of bufs[i].
  virtual Status all_reduce(const std::vector<Tensor>& bufs, ReduceOp op) = 0;
  // in [R * C] on every rank -> out [C] = the reduction of chunk `rank` of every rank's in.
  // out may be that chunk of in itself (in place).
  virtual Status reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // in [C] on every rank -> out [R * C] on every rank, chunk k = rank k's in. in may be chunk
  // `rank` of out itself (in place).
  virtual Status all_gather(const Tensor& in, const Tensor& out) = 0;
  // Every rank's bufs[i] becomes rank root's bufs[i].
  virtual Status broadcast(const std::vector<Tensor>& bufs, int root) = 0;
  // bufs[i] on rank owners[i] becomes the reduction over ranks of bufs[i]; the others' stay as
  // they were (ZeRO-2: each rank keeps the reduced gradients of the parameters it steps).
  virtual Status reduce_to_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners, ReduceOp op) = 0;
  // Every rank's bufs[i] becomes rank owners[i]'s bufs[i] (ZeRO: the weights each owner stepped).
  virtual Status gather_from_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners) = 0;
  virtual Status barrier() = 0;
  // Fail every pending and later call of the group with `why` (a rank that raised: the others
  // must not wait for it forever). Safe from any thread, any number of times.
  virtual void abort(const std::string& why) = 0;
};

// The threads backend: `world` ranks that are threads of this process, CPU tensors. The ranks
// read each other's memory directly (one shared address space): a reduction is one pass in
// which rank r reduces its 1/R share of the elements and writes the result into every rank's
// buffer; gathers and broadcasts are memcpy.
std::vector<std::shared_ptr<Communicator>> make_thread_group(int world);

// The TCP backend (dist/tcp_group.cpp): this process is rank `rank` of `world`, each rank a
// process (or a node), CPU tensors. Rank 0 listens on host:port, the others connect to it; the
// data moves through rank 0, which reduces in rank order in f32 (the threads backend's results,
// bit for bit). Setup and every wait for a peer are bounded by timeout_s; a closed connection or
// a timeout fails the call with an error naming the peer's rank and address.
Status make_tcp_group(int rank, int world, const std::string& host, int port, double timeout_s,
                      std::shared_ptr<Communicator>* out);
// `channels` communicators of one group over the one port (each rank connects once per channel):
// independent groups whose collectives may run at once from different threads.
Status make_tcp_groups(int rank, int world, const std::string& host, int port, double timeout_s, int channels,
                       std::vector<std::shared_ptr<Communicator>>* out);

// The NCCL backend (dist/nccl_group.cpp, built with SG_WITH_NCCL; untested on GPUs so far): one
// rank per GPU in `devices`, tensors in each rank's device memory.
Status make_nccl_group(const std::vector<int>& devices, std::vector<std::shared_ptr<Communicator>>* out);

}  // namespace surogate::dist
