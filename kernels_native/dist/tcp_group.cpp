// The TCP backend of dist/collective.h: one rank per process (or per node), host memory, a star
// around rank 0.
//
// Setup: rank 0 listens on host:port, every other rank connects to it (retrying until rank 0
// listens, within the timeout) and says hello (magic, version, rank, world, channel, channels);
// rank 0 accepts until it has one connection per rank and channel, checking that no rank comes
// twice on a channel and that all agree on the world and the channel count. Each channel is a
// communicator of its own over one listening port (a data-parallel rank's second: the gradient
// reducer's, whose collectives run on a thread of their own beside the Program's).
//
// Every collective is:
//   1. each rank r > 0 sends rank 0 a description of its call (kind, op, root, owners, and per
//      tensor: elements, dtype, where it lives, contiguity, writability);
//   2. rank 0 checks every rank's call against its own, with the threads backend's rules and
//      messages, and sends every rank the verdict: all ranks pass or all fail, none is left
//      waiting;
//   3. the data moves through rank 0: the ranks send it what it needs, in rank order; it
//      reduces or assembles and sends each rank its result.
// Rank 0 reduces an element as ((x_0 + x_1) + x_2) + ... in f32, in rank order, then rounds
// once to the tensor's dtype: the threads backend's order, so a run of R processes equals a
// run of R threads bit for bit.
//
// Failures: every wait for a peer is bounded by the timeout, and a closed connection fails at
// once; either error names the peer's rank and address. After one, the communicator is broken:
// it shuts its sockets (so that the other ranks fail too instead of waiting) and every later
// call returns the first error. abort() does the same from any thread.
//
// A star, not a ring: rank 0 moves R times the data, which is fine for a few nodes over host
// memory; a ring all-reduce would change nothing of the interface. (Past 400 lines: the setup,
// the wire format of a call, the checks, which mirror thread_group.cpp's word for word, and the
// movement of each collective are one protocol.)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "dist/call_check.h"

namespace surogate::dist {

namespace {

constexpr uint32_t kMagic = 0x53475443;  // "SGTC"
constexpr uint32_t kVersion = 2;  // 2: the hello names a channel
constexpr size_t kChunk = 1 << 20;  // bytes reduced per received piece

// ---- (de)serializing a call's description ---------------------------------------------------

struct Writer {
  std::string b;
  template <typename T> void put(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void str(const std::string& s) { put<uint32_t>(static_cast<uint32_t>(s.size())), b += s; }
};

struct Reader {
  const std::string& b;
  size_t at = 0;
  bool ok = true;
  template <typename T> T get() {
    T v{};
    if (at + sizeof(T) > b.size()) return ok = false, v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const uint32_t n = get<uint32_t>();
    if (!ok || at + n > b.size()) return ok = false, std::string();
    std::string s = b.substr(at, n);
    at += n;
    return s;
  }
};

std::string encode(const CallDesc& d) {
  Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(d.kind)), w.put<uint32_t>(static_cast<uint32_t>(d.op)), w.put<int32_t>(d.root);
  w.put<uint32_t>(static_cast<uint32_t>(d.owners.size()));
  for (int32_t o : d.owners) w.put<int32_t>(o);
  w.put<uint32_t>(static_cast<uint32_t>(d.bufs.size()));
  for (const TensorDesc& t : d.bufs) {
    w.put<int64_t>(t.numel), w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put<uint8_t>(static_cast<uint8_t>(t.cpu | t.contiguous << 1 | t.has_data << 2 | t.readonly << 3));
    w.str(t.describe);
  }
  return w.b;
}

bool decode(const std::string& b, CallDesc* d) {
  Reader r{b};
  d->kind = static_cast<Kind>(r.get<uint32_t>()), d->op = static_cast<ReduceOp>(r.get<uint32_t>());
  d->root = r.get<int32_t>();
  const uint32_t no = r.get<uint32_t>();
  if (!r.ok || no > b.size()) return false;
  d->owners.resize(no);
  for (auto& o : d->owners) o = r.get<int32_t>();
  const uint32_t nb = r.get<uint32_t>();
  if (!r.ok || nb > b.size()) return false;
  d->bufs.resize(nb);
  for (TensorDesc& t : d->bufs) {
    t.numel = r.get<int64_t>();
    const uint8_t dt = r.get<uint8_t>(), f = r.get<uint8_t>();
    if (dt >= kNumDTypes) return false;
    t.dtype = static_cast<DType>(dt);
    t.cpu = f & 1, t.contiguous = f & 2, t.has_data = f & 4, t.readonly = f & 8;
    t.describe = r.str();
  }
  return r.ok && r.at == b.size() && static_cast<uint32_t>(d->kind) <= static_cast<uint32_t>(Kind::kBarrier);
}

// ---- reductions in f32 ----------------------------------------------------------------------

template <typename T>
void accumulate_t(const void* src, float* acc, int64_t n, bool first) {
  const T* s = static_cast<const T*>(src);
  if (first) {
    for (int64_t j = 0; j < n; ++j) acc[j] = load(s[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) acc[j] += load(s[j]);
  }
}

void accumulate(DType dt, const void* src, float* acc, int64_t n, bool first) {
  switch (dt) {
    case DType::kF32: accumulate_t<float>(src, acc, n, first); break;
    case DType::kBF16: accumulate_t<bf16_t>(src, acc, n, first); break;
    case DType::kF16: accumulate_t<f16_t>(src, acc, n, first); break;
    default: break;  // validate() refused it
  }
}

template <typename T>
void finish_t(float* acc, int64_t n, ReduceOp op, int world, void* dst) {
  T* d = static_cast<T*>(dst);
  if (op == ReduceOp::kMean) {
    const float R = static_cast<float>(world);
    for (int64_t j = 0; j < n; ++j) acc[j] /= R;
  }
  for (int64_t j = 0; j < n; ++j) d[j] = store<T>(acc[j]);
}

// acc (the sum over ranks) -> dst in dtype dt (the mean divides first, as the threads backend).
void finish(DType dt, float* acc, int64_t n, ReduceOp op, int world, void* dst) {
  switch (dt) {
    case DType::kF32: finish_t<float>(acc, n, op, world, dst); break;
    case DType::kBF16: finish_t<bf16_t>(acc, n, op, world, dst); break;
    case DType::kF16: finish_t<f16_t>(acc, n, op, world, dst); break;
    default: break;
  }
}

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }
char* bytes(const Tensor& t, int64_t elem_off = 0) {
  return static_cast<char*>(t.data) + elem_off * static_cast<int64_t>(dtype_size(t.dtype));
}

// ---- sockets ----------------------------------------------------------------------------------

std::string errno_text(int e) { return std::strerror(e); }

Status resolve(const std::string& host, int port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM;
  const std::string p = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res);
  SG_CHECK(rc == 0 && res != nullptr, StatusCode::kNetworkError,
           str_cat("tcp_group: cannot resolve ", host, ": ", gai_strerror(rc)),
           "pass rank 0's address as an IP or a name every rank can resolve");
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return Status::OK();
}

std::string peer_name(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&sa), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return str_cat(host, ":", serv);
}

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(int rank, int world, std::string address, double timeout_s)
      : rank_(rank), world_(world), address_(std::move(address)),
        timeout_ms_(static_cast<int>(std::clamp(timeout_s * 1000.0, 1.0, 2.0e9))), fds_(world, -1),
        peers_(world) {
    peers_[0] = address_;
  }
  ~TcpCommunicator() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "tcp"; }

  // Rank 0: accept every rank on every channel of `chans` (this communicator is channel 0). The
  // others: this communicator's connection as channel `channel` of `channels`.
  Status connect_root(const std::vector<TcpCommunicator*>& chans) { return world_ == 1 ? Status::OK() : accept_peers(chans); }
  Status connect_peer(uint32_t channel, uint32_t channels) {
    return world_ == 1 ? Status::OK() : connect_to_root(channel, channels);
  }

  Status all_reduce(const std::vector<Tensor>& bufs, ReduceOp op) override {
    return run(Kind::kAllReduce, bufs, op, 0, {}, [&] { return move_reduce(bufs, op, nullptr); });
  }
  Status reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    return run(Kind::kReduceScatter, {in, out}, op, 0, {}, [&] { return move_reduce_scatter(in, out, op); });
  }
  Status all_gather(const Tensor& in, const Tensor& out) override {
    return run(Kind::kAllGather, {in, out}, ReduceOp::kSum, 0, {}, [&] { return move_all_gather(in, out); });
  }
  Status broadcast(const std::vector<Tensor>& bufs, int root) override {
    return run(Kind::kBroadcast, bufs, ReduceOp::kSum, root, {}, [&] { return move_broadcast(bufs, root); });
  }
  Status reduce_to_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners, ReduceOp op) override {
    return run(Kind::kReduceToOwners, bufs, op, 0, owners, [&] { return move_reduce(bufs, op, &owners); });
  }
  Status gather_from_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners) override {
    return run(Kind::kGatherFromOwners, bufs, ReduceOp::kSum, 0, owners,
               [&] { return move_gather_from_owners(bufs, owners); });
  }
  Status barrier() override {
    return run(Kind::kBarrier, {}, ReduceOp::kSum, 0, {}, [] { return Status::OK(); });
  }

  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_) {
        broken_ = true;
        error_ = SG_ERROR(StatusCode::kInternal, str_cat("collective aborted: ", why),
                          "another rank of the data-parallel group failed; its error is the one to read");
      }
    }
    shutdown_all();
  }

 private:
  // ---- setup ----
  Status accept_peers(const std::vector<TcpCommunicator*>& chans) {
    const int channels = static_cast<int>(chans.size());
    sockaddr_storage sa{};
    socklen_t len = 0;
    const size_t colon = address_.rfind(':');
    SG_RETURN_IF_ERROR(resolve(address_.substr(0, colon), std::stoi(address_.substr(colon + 1)), &sa, &len));
    const int ls = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SG_CHECK(ls >= 0, StatusCode::kNetworkError, str_cat("tcp_group: socket(): ", errno_text(errno)), "");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{ls};
    SG_CHECK(::bind(ls, reinterpret_cast<sockaddr*>(&sa), len) == 0, StatusCode::kNetworkError,
             str_cat("tcp_group: rank 0 cannot listen on ", address_, ": ", errno_text(errno)),
             "pick a free port on rank 0's host (the launcher does), and rank 0's own address");
    SG_CHECK(::listen(ls, world_ * channels) == 0, StatusCode::kNetworkError,
             str_cat("tcp_group: listen on ", address_, ": ", errno_text(errno)), "");
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    int joined = 0;
    while (joined < (world_ - 1) * channels) {
      pollfd p{ls, POLLIN, 0};
      const int rc = ::poll(&p, 1, ms_left(deadline));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) {
        std::string missing;
        for (int r = 1; r < world_; ++r) {
          for (int c = 0; c < channels; ++c) {
            if (chans[c]->fds_[r] < 0) {
              missing += str_cat(missing.empty() ? "" : ", ", r, channels > 1 ? str_cat(" (channel ", c, ")") : "");
            }
          }
        }
        return SG_ERROR(StatusCode::kNetworkError,
                        str_cat("tcp_group: rank 0 at ", address_, " waited ", timeout_ms_ / 1000.0,
                                " s for rank(s) ", missing, " of ", world_, " to connect"),
                        "start every rank with the same address and world size; check that the port is reachable");
      }
      const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      set_nodelay(fd);
      // The hello: magic, version, rank, world, channel, channels. A stranger (a port scan) is
      // dropped, not fatal.
      uint32_t hello[6] = {0, 0, 0, 0, 0, 0};
      Status st = io(fd, -1, hello, sizeof(hello), false, "the hello", Clock::now() + std::chrono::seconds(10));
      const int r = static_cast<int>(hello[2]);
      const int c = static_cast<int>(hello[4]);
      if (!st.ok() || hello[0] != kMagic || hello[1] != kVersion) {
        ::close(fd);
        continue;
      }
      // 0: welcome, 1: wrong world, 2: rank taken or out of range, 3: another channel count
      uint32_t verdict = 0;
      if (static_cast<int>(hello[3]) != world_) {
        verdict = 1;
      } else if (static_cast<int>(hello[5]) != channels || c < 0 || c >= channels) {
        verdict = 3;
      } else if (r < 1 || r >= world_ || chans[c]->fds_[r] >= 0) {
        verdict = 2;
      }
      uint32_t reply[2] = {kMagic, verdict};
      st = io(fd, -1, reply, sizeof(reply), true, "the welcome", Clock::now() + std::chrono::seconds(10));
      if (verdict != 0 || !st.ok()) {
        const std::string who = peer_name(fd);
        ::close(fd);
        if (verdict == 1) {
          return SG_ERROR(StatusCode::kInvalidArgument,
                          str_cat("tcp_group: a rank from ", who, " says the world has ", hello[3],
                                  " ranks, rank 0 says ", world_),
                          "start every rank with the same world size");
        }
        if (verdict == 3) {
          return SG_ERROR(StatusCode::kInvalidArgument,
                          str_cat("tcp_group: a rank from ", who, " joins channel ", c, " of ", hello[5],
                                  ", rank 0 opened ", channels),
                          "run the same surogate version and config on every rank");
        }
        if (verdict == 2) {
          return SG_ERROR(StatusCode::kInvalidArgument,
                          str_cat("tcp_group: a second rank ", r, " (or one out of range) connected from ", who),
                          "give each process its own rank in [1, world)");
        }
        continue;
      }
      chans[c]->fds_[r] = fd;
      chans[c]->peers_[r] = peer_name(fd);
      ++joined;
    }
    return Status::OK();
  }

  Status connect_to_root(uint32_t channel, uint32_t channels) {
    const size_t colon = address_.rfind(':');
    sockaddr_storage sa{};
    socklen_t len = 0;
    SG_RETURN_IF_ERROR(resolve(address_.substr(0, colon), std::stoi(address_.substr(colon + 1)), &sa, &len));
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    std::string last = "no attempt";
    while (true) {
      const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      SG_CHECK(fd >= 0, StatusCode::kNetworkError, str_cat("tcp_group: socket(): ", errno_text(errno)), "");
      if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
        set_nodelay(fd);
        fds_[0] = fd;
        break;
      }
      last = errno_text(errno);
      ::close(fd);
      if (Clock::now() >= deadline) {
        return SG_ERROR(StatusCode::kNetworkError,
                        str_cat("tcp_group: rank ", rank_, " could not connect to rank 0 at ", address_, " within ",
                                timeout_ms_ / 1000.0, " s (", last, ")"),
                        "start rank 0 with the same address; check that its port is reachable from this host");
      }
      ::usleep(100 * 1000);  // rank 0 may not listen yet
    }
    const auto deadline2 = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    uint32_t hello[6] = {kMagic, kVersion, static_cast<uint32_t>(rank_), static_cast<uint32_t>(world_), channel,
                         channels};
    SG_RETURN_IF_ERROR(io(fds_[0], 0, hello, sizeof(hello), true, "the hello", deadline2));
    uint32_t reply[2] = {0, 0};
    SG_RETURN_IF_ERROR(io(fds_[0], 0, reply, sizeof(reply), false, "the welcome", deadline2));
    SG_CHECK(reply[0] == kMagic, StatusCode::kNetworkError,
             str_cat("tcp_group: ", address_, " is not a surogate rank 0"), "check the address and port");
    SG_CHECK(reply[1] == 0, StatusCode::kInvalidArgument,
             str_cat("tcp_group: rank 0 at ", address_, " refused rank ", rank_, " of ", world_,
                     reply[1] == 1   ? ": it has another world size"
                     : reply[1] == 3 ? ": it opened another number of channels"
                                     : ": that rank is taken or out of range"),
             "give each process its own rank and the same world size");
    return Status::OK();
  }

  // ---- I/O ----
  // All n bytes to / from rank `peer`'s socket; each wait bounded by the deadline (-1 peer: a
  // socket not yet a rank's).
  Status io(int fd, int peer, void* buf, size_t n, bool sending, const char* what, Clock::time_point deadline) {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      if (peer >= 0 && is_broken()) return error();
      pollfd pf{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
      const int rc = ::poll(&pf, 1, ms_left(deadline));
      if (rc < 0 && errno == EINTR) continue;
      if (peer >= 0 && is_broken()) return error();
      if (rc == 0) {
        return SG_ERROR(StatusCode::kNetworkError,
                        str_cat("tcp collective: rank ", rank_, " waited ", timeout_ms_ / 1000.0, " s for rank ",
                                peer, " (", peer >= 0 ? peers_[peer] : "?", ") ", sending ? "to take " : "to send ",
                                what),
                        "that rank hangs or is far slower; raise the collective timeout if its steps are that long");
      }
      const ssize_t k = sending ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
      if (k > 0) {
        p += k, n -= static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (peer >= 0 && is_broken()) return error();
      const std::string why = k == 0 ? "closed the connection" : str_cat("failed (", errno_text(errno), ")");
      return SG_ERROR(StatusCode::kNetworkError,
                      str_cat("tcp collective: the connection of rank ", rank_, " to rank ", peer, " (",
                              peer >= 0 ? peers_[peer] : "?", ") ", why, " during ", what),
                      peer == 0 ? "rank 0 exited, failed, or lost another rank: the run's first error is the one "
                                  "to read"
                                : "that rank exited or failed: its error is the one to read");
    }
    return Status::OK();
  }

  Status xfer(int peer, void* buf, size_t n, bool sending) {
    return io(fds_[peer], peer, buf, n, sending, what_, Clock::now() + std::chrono::milliseconds(timeout_ms_));
  }
  Status send(int peer, const void* buf, size_t n) { return xfer(peer, const_cast<void*>(buf), n, true); }
  Status recv(int peer, void* buf, size_t n) { return xfer(peer, buf, n, false); }
  Status send_msg(int peer, const std::string& s) {
    const uint64_t n = s.size();
    SG_RETURN_IF_ERROR(send(peer, &n, sizeof(n)));
    return send(peer, s.data(), s.size());
  }
  Status recv_msg(int peer, std::string* s) {
    uint64_t n = 0;
    SG_RETURN_IF_ERROR(recv(peer, &n, sizeof(n)));
    SG_CHECK(n < (1u << 30), StatusCode::kNetworkError, str_cat("tcp collective: garbage from rank ", peer), "");
    s->resize(n);
    return recv(peer, s->data(), n);
  }

  bool is_broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  Status error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  // The first failure sticks: the sockets are shut so that the peers fail too.
  Status fail(Status st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return error_;
      broken_ = true;
      error_ = st;
    }
    shutdown_all();
    return st;
  }
  void shutdown_all() {
    for (int fd : fds_) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
  }

  // ---- one collective ----
  template <typename Move>
  Status run(Kind kind, const std::vector<Tensor>& bufs, ReduceOp op, int root, const std::vector<int>& owners,
             Move&& move) {
    std::lock_guard<std::mutex> one(call_mu_);  // one collective at a time per rank
    if (is_broken()) return error();
    what_ = kind_name(kind);
    const CallDesc mine = describe_call(kind, bufs, op, root, owners);
    Status verdict;
    Status st = agree(mine, &verdict);
    if (!st.ok()) return fail(st);
    if (!verdict.ok()) return verdict;  // every rank got the same one: the group is still in step
    st = move();
    return st.ok() ? st : fail(st);
  }

  // Step 1-2: the calls to rank 0, its verdict to everyone. Returns an I/O error, or OK with
  // the verdict in *verdict.
  Status agree(const CallDesc& mine, Status* verdict) {
    if (rank_ != 0) {
      SG_RETURN_IF_ERROR(send_msg(0, encode(mine)));
      std::string v;
      SG_RETURN_IF_ERROR(recv_msg(0, &v));
      Reader r{v};
      const uint32_t code = r.get<uint32_t>();
      std::string msg = r.str(), hint = r.str();
      SG_CHECK(r.ok, StatusCode::kNetworkError, "tcp collective: a garbled verdict from rank 0", "");
      *verdict = code == 0 ? Status::OK() : Status(static_cast<StatusCode>(code), msg, __FILE__, __LINE__, hint);
      return Status::OK();
    }
    std::vector<CallDesc> calls(world_);
    calls[0] = mine;
    for (int k = 1; k < world_; ++k) {
      std::string b;
      SG_RETURN_IF_ERROR(recv_msg(k, &b));
      SG_CHECK(decode(b, &calls[k]), StatusCode::kNetworkError,
               str_cat("tcp collective: a garbled call from rank ", k, " (", peers_[k], ")"),
               "every rank must run the same surogate version");
    }
    *verdict = validate(calls, "TCP");
    Writer w;
    w.put<uint32_t>(static_cast<uint32_t>(verdict->code())), w.str(verdict->message()), w.str(verdict->hint());
    for (int k = 1; k < world_; ++k) SG_RETURN_IF_ERROR(send_msg(k, w.b));
    return Status::OK();
  }

  // Rank 0: the sum over ranks of every rank's bufs (its own first, then each peer's as it
  // arrives, in rank order), in f32; acc holds the bucket's elements back to back.
  Status reduce_at_root(const std::vector<Tensor>& bufs, std::vector<float>* acc) {
    int64_t total = 0;
    for (const Tensor& t : bufs) total += t.numel();
    acc->resize(static_cast<size_t>(total));
    int64_t base = 0;
    for (const Tensor& t : bufs) {
      accumulate(t.dtype, t.data, acc->data() + base, t.numel(), true);
      base += t.numel();
    }
    std::vector<char> piece(kChunk);
    for (int k = 1; k < world_; ++k) {
      base = 0;
      for (const Tensor& t : bufs) {
        const size_t es = dtype_size(t.dtype);
        const int64_t per = static_cast<int64_t>(kChunk / es);
        for (int64_t a = 0; a < t.numel(); a += per) {
          const int64_t m = std::min(per, t.numel() - a);
          SG_RETURN_IF_ERROR(recv(k, piece.data(), static_cast<size_t>(m) * es));
          accumulate(t.dtype, piece.data(), acc->data() + base + a, m, false);
        }
        base += t.numel();
      }
    }
    return Status::OK();
  }

  // all_reduce (owners null) or reduce_to_owners.
  Status move_reduce(const std::vector<Tensor>& bufs, ReduceOp op, const std::vector<int>* owners) {
    if (rank_ != 0) {
      for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(send(0, t.data, nbytes(t)));
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (owners == nullptr || (*owners)[i] == rank_) SG_RETURN_IF_ERROR(recv(0, bufs[i].data, nbytes(bufs[i])));
      }
      return Status::OK();
    }
    std::vector<float> acc;
    SG_RETURN_IF_ERROR(reduce_at_root(bufs, &acc));
    std::vector<char> staged;
    int64_t base = 0;
    std::vector<int64_t> bases;
    for (const Tensor& t : bufs) bases.push_back(base), base += t.numel();
    // Rank 0's own tensors (all of them, or those it owns), then each peer's results.
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (owners == nullptr || (*owners)[i] == 0) {
        finish(bufs[i].dtype, acc.data() + bases[i], bufs[i].numel(), op, world_, bufs[i].data);
      }
    }
    if (owners == nullptr) {
      for (int k = 1; k < world_; ++k) {
        for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(send(k, t.data, nbytes(t)));
      }
      return Status::OK();
    }
    for (size_t i = 0; i < bufs.size(); ++i) {
      const int o = (*owners)[i];
      if (o == 0) continue;
      staged.resize(nbytes(bufs[i]));
      finish(bufs[i].dtype, acc.data() + bases[i], bufs[i].numel(), op, world_, staged.data());
      SG_RETURN_IF_ERROR(send(o, staged.data(), staged.size()));
    }
    return Status::OK();
  }

  Status move_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
    const int64_t C = out.numel();
    const size_t cb = nbytes(out);
    if (rank_ != 0) {
      SG_RETURN_IF_ERROR(send(0, in.data, nbytes(in)));
      return recv(0, out.data, cb);
    }
    std::vector<float> acc;
    SG_RETURN_IF_ERROR(reduce_at_root({in}, &acc));
    std::vector<char> staged(cb);
    for (int k = 1; k < world_; ++k) {
      finish(out.dtype, acc.data() + k * C, C, op, world_, staged.data());
      SG_RETURN_IF_ERROR(send(k, staged.data(), cb));
    }
    finish(out.dtype, acc.data(), C, op, world_, out.data);  // last: out may be chunk 0 of in
    return Status::OK();
  }

  Status move_all_gather(const Tensor& in, const Tensor& out) {
    const int64_t C = in.numel();
    const size_t cb = nbytes(in);
    if (rank_ != 0) {
      SG_RETURN_IF_ERROR(send(0, in.data, cb));
      return recv(0, out.data, nbytes(out));
    }
    if (bytes(out) != in.data && cb > 0) std::memmove(bytes(out), in.data, cb);
    for (int k = 1; k < world_; ++k) SG_RETURN_IF_ERROR(recv(k, bytes(out, k * C), cb));
    for (int k = 1; k < world_; ++k) SG_RETURN_IF_ERROR(send(k, out.data, nbytes(out)));
    return Status::OK();
  }

  Status move_broadcast(const std::vector<Tensor>& bufs, int root) {
    if (rank_ != 0) {
      if (rank_ == root) {
        for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(send(0, t.data, nbytes(t)));
      } else {
        for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(recv(0, t.data, nbytes(t)));
      }
      return Status::OK();
    }
    if (root != 0) {
      for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(recv(root, t.data, nbytes(t)));
    }
    for (int k = 1; k < world_; ++k) {
      if (k == root) continue;
      for (const Tensor& t : bufs) SG_RETURN_IF_ERROR(send(k, t.data, nbytes(t)));
    }
    return Status::OK();
  }

  Status move_gather_from_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners) {
    if (rank_ != 0) {
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (owners[i] == rank_) SG_RETURN_IF_ERROR(send(0, bufs[i].data, nbytes(bufs[i])));
      }
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (owners[i] != rank_) SG_RETURN_IF_ERROR(recv(0, bufs[i].data, nbytes(bufs[i])));
      }
      return Status::OK();
    }
    for (int k = 1; k < world_; ++k) {
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (owners[i] == k) SG_RETURN_IF_ERROR(recv(k, bufs[i].data, nbytes(bufs[i])));
      }
    }
    for (int k = 1; k < world_; ++k) {
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (owners[i] != k) SG_RETURN_IF_ERROR(send(k, bufs[i].data, nbytes(bufs[i])));
      }
    }
    return Status::OK();
  }

  const int rank_, world_;
  const std::string address_;  // rank 0's host:port
  const int timeout_ms_;
  std::vector<int> fds_;            // rank 0: fds_[k] to rank k; the others: fds_[0]
  std::vector<std::string> peers_;  // the address of each rank this one talks to
  std::mutex call_mu_;
  const char* what_ = "";  // the collective in flight, for errors
  std::mutex mu_;
  bool broken_ = false;
  Status error_;
};

}  // namespace

Status make_tcp_groups(int rank, int world, const std::string& host, int port, double timeout_s, int channels,
                       std::vector<std::shared_ptr<Communicator>>* out) {
  SG_CHECK(world >= 1 && rank >= 0 && rank < world, StatusCode::kInvalidArgument,
           str_cat("tcp_group: rank ", rank, " of a world of ", world), "a rank is in [0, world)");
  SG_CHECK(port > 0 && port < 65536, StatusCode::kInvalidArgument, str_cat("tcp_group: port ", port),
           "pass rank 0's listening port, 1-65535");
  SG_CHECK(timeout_s > 0, StatusCode::kInvalidArgument, str_cat("tcp_group: timeout ", timeout_s, " s"),
           "pass a positive timeout");
  SG_CHECK(channels >= 1 && channels <= 16, StatusCode::kInvalidArgument, str_cat("tcp_group: ", channels, " channels"),
           "open 1 to 16 communicators over one port");
  std::vector<std::shared_ptr<TcpCommunicator>> comms;
  std::vector<TcpCommunicator*> raw;
  for (int c = 0; c < channels; ++c) {
    comms.push_back(std::make_shared<TcpCommunicator>(rank, world, str_cat(host, ":", port), timeout_s));
    raw.push_back(comms.back().get());
  }
  if (rank == 0) {
    SG_RETURN_IF_ERROR(comms[0]->connect_root(raw));
  } else {
    for (int c = 0; c < channels; ++c) {
      SG_RETURN_IF_ERROR(comms[c]->connect_peer(static_cast<uint32_t>(c), static_cast<uint32_t>(channels)));
    }
  }
  out->assign(comms.begin(), comms.end());
  return Status::OK();
}

Status make_tcp_group(int rank, int world, const std::string& host, int port, double timeout_s,
                      std::shared_ptr<Communicator>* out) {
  std::vector<std::shared_ptr<Communicator>> comms;
  SG_RETURN_IF_ERROR(make_tcp_groups(rank, world, host, port, timeout_s, 1, &comms));
  *out = comms[0];
  return Status::OK();
}

}  // namespace surogate::dist
