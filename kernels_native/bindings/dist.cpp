// _native.Communicator: the collectives of dist/collective.h for Python callers (the trainer's
// rank threads). Arguments become Tensors with the GIL held, then every call releases it: a
// rank waits in a rendezvous for ranks that need the GIL to get there.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "bindings/errors.h"
#include "dist/collective.h"
#include "dist/grad_reducer.h"

namespace py = pybind11;

namespace surogate::bindings {

Tensor to_tensor(const py::handle& h);  // bindings/module.cpp

namespace {

using dist::Communicator;
using dist::ReduceOp;

ReduceOp parse_op(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "mean") return ReduceOp::kMean;
  throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("unknown reduce op '", op, "'"), "use 'sum' or 'mean'"));
}

std::vector<Tensor> tensors(const py::sequence& seq) {
  std::vector<Tensor> out;
  for (auto h : seq) out.push_back(to_tensor(h));
  return out;
}

// Run `fn` without the GIL; the tensors (and the Python arrays they hold) outlive it.
template <typename Fn>
void nogil(Fn&& fn) {
  Status st;
  {
    py::gil_scoped_release release;
    st = fn();
  }
  check(st);
}

}  // namespace

void bind_dist(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator",
      "One rank's handle on a data-parallel group (kernels_native/dist/collective.h). Every call is "
      "collective: all ranks make it, in the same order, with matching tensors.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::world_size)
      .def_property_readonly("backend", &Communicator::backend)
      .def("all_reduce", [](Communicator& c, const py::sequence& bufs, const std::string& op) {
             auto ts = tensors(bufs);
             ReduceOp o = parse_op(op);
             nogil([&] { return c.all_reduce(ts, o); });
           }, py::arg("bufs"), py::arg("op") = "sum", "In place over a bucket of tensors.")
      .def("reduce_scatter", [](Communicator& c, py::handle in, py::handle out, const std::string& op) {
             Tensor i = to_tensor(in), o = to_tensor(out);
             ReduceOp r = parse_op(op);
             nogil([&] { return c.reduce_scatter(i, o, r); });
           }, py::arg("inp"), py::arg("out"), py::arg("op") = "sum")
      .def("all_gather", [](Communicator& c, py::handle in, py::handle out) {
             Tensor i = to_tensor(in), o = to_tensor(out);
             nogil([&] { return c.all_gather(i, o); });
           }, py::arg("inp"), py::arg("out"))
      .def("broadcast", [](Communicator& c, const py::sequence& bufs, int root) {
             auto ts = tensors(bufs);
             nogil([&] { return c.broadcast(ts, root); });
           }, py::arg("bufs"), py::arg("root") = 0)
      .def("reduce_to_owners", [](Communicator& c, const py::sequence& bufs, const std::vector<int>& owners,
                                  const std::string& op) {
             auto ts = tensors(bufs);
             ReduceOp o = parse_op(op);
             nogil([&] { return c.reduce_to_owners(ts, owners, o); });
           }, py::arg("bufs"), py::arg("owners"), py::arg("op") = "sum")
      .def("gather_from_owners", [](Communicator& c, const py::sequence& bufs, const std::vector<int>& owners) {
             auto ts = tensors(bufs);
             nogil([&] { return c.gather_from_owners(ts, owners); });
           }, py::arg("bufs"), py::arg("owners"))
      .def("barrier", [](Communicator& c) { nogil([&] { return c.barrier(); }); })
      .def("abort", [](Communicator& c, const std::string& why) { c.abort(why); }, py::arg("why"));

  py::class_<dist::GradReducer, std::shared_ptr<dist::GradReducer>>(
      m, "GradReducer",
      "A rank's gradient reductions on a thread of its own (dist/grad_reducer.h), over the Communicator of a "
      "group of their own; the training Program's grad_reduce / grad_wait instructions use it.")
      .def(py::init<std::shared_ptr<Communicator>>(), py::arg("comm"))
      .def("arm", &dist::GradReducer::arm, py::arg("on") = true,
           "Reduce during the next backward (the rank's last of the step); its grad_wait disarms.")
      .def_property_readonly("armed", &dist::GradReducer::armed)
      .def("start", [](dist::GradReducer& r, const py::sequence& bufs, std::optional<std::vector<int>> owners,
                       int64_t tag) {
             auto ts = tensors(bufs);
             for (Tensor& t : ts) t.owner.reset();  // (the caller keeps them until wait(): no GIL on the thread)
             check(r.start(std::move(ts), owners.value_or(std::vector<int>{}), tag));
           }, py::arg("bufs"), py::arg("owners") = py::none(), py::arg("tag") = -1,
           "Queue one reduction (owners None: an all-reduce), as grad_reduce does; the arrays must live until wait().")
      .def("wait", [](dist::GradReducer& r) { nogil([&] { return r.wait(); }); })
      .def("take_steps", &dist::GradReducer::take_steps,
           "How many backward passes reduced their gradients since the last call.")
      .def("record", &dist::GradReducer::set_recording, py::arg("on") = true,
           "Record events from now on (the old ones cleared): for tests of the overlap.")
      .def("events", [](const dist::GradReducer& r) {
             py::list out;
             for (const auto& e : r.events()) out.append(py::make_tuple(e.kind, e.tag, e.ns));
             return out;
           }, "(kind, tag, steady-clock ns) per event: start (queued), begin and end (the reduction), wait.")
      .def("abort", &dist::GradReducer::abort, py::arg("why"));

  m.def("thread_group", [](int world) {
          if (world < 1) {
            throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("thread_group(", world, ")"),
                                  "a group has at least one rank"));
          }
          return dist::make_thread_group(world);
        }, py::arg("world"),
        "One Communicator per rank of a group whose ranks are threads of this process (host memory).");
  m.def("tcp_group", [](int rank, int world, const std::string& host, int port, double timeout_s) {
          std::shared_ptr<Communicator> out;
          Status st;
          {
            py::gil_scoped_release release;
            st = dist::make_tcp_group(rank, world, host, port, timeout_s, &out);
          }
          check(st);
          return out;
        }, py::arg("rank"), py::arg("world"), py::arg("host"), py::arg("port"), py::arg("timeout_s") = 1800.0,
        "This process's Communicator as rank `rank` of `world` processes over TCP (host memory): rank 0 "
        "listens on host:port, the others connect. Blocks until every rank has joined (at most timeout_s, "
        "which also bounds every later wait for a peer).");
  m.def("tcp_groups", [](int rank, int world, const std::string& host, int port, int channels, double timeout_s) {
          std::vector<std::shared_ptr<Communicator>> out;
          Status st;
          {
            py::gil_scoped_release release;
            st = dist::make_tcp_groups(rank, world, host, port, timeout_s, channels, &out);
          }
          check(st);
          return out;
        }, py::arg("rank"), py::arg("world"), py::arg("host"), py::arg("port"), py::arg("channels"),
        py::arg("timeout_s") = 1800.0,
        "`channels` Communicators of this process as rank `rank` of `world` over TCP, all through rank 0's one "
        "listening port (each rank connects once per channel): independent groups whose collectives may run at "
        "once from different threads (a rank's Program and its gradient reducer).");
  m.def("nccl_group", [](const std::vector<int>& devices) {
          std::vector<std::shared_ptr<Communicator>> out;
#ifdef SG_WITH_NCCL
          Status st;
          {
            py::gil_scoped_release release;
            st = dist::make_nccl_group(devices, &out);
          }
          check(st);
#else
          throw_status(SG_ERROR(StatusCode::kUnsupported, "this surogate was built without NCCL",
                                "build with the CUDA backend and -DSUROGATE_NCCL=ON (NCCL's nccl.h and libnccl)"));
#endif
          return out;
        }, py::arg("devices"),
        "One Communicator per GPU in `devices` over NCCL (device tensors). Untested on GPUs so far.");
}

}  // namespace surogate::bindings
