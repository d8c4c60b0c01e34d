// _native.serve: the continuous-batching engine as Python sees it. Requests cross as plain
// fields: sampling parameters and the engine config are read by attribute name from any object
// (surogate.serve.types' msgspec Structs), outputs come back as tuples in
// surogate.serve.types.RequestOutput's field order. The engine thread never holds the GIL;
// PyModelRunner takes it only around its Python call, and every call that may wait on the engine
// (step, poll, shutdown, dropping the engine) releases it. Past 400 lines because the field-by-
// field conversions of the wire types sit next to the classes that use them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_set>

#include "bindings/errors.h"
#include "runtime/op_checks_sample.h"
#include "runtime/program.h"
#include "serve/engine.h"
#include "serve/program_runner.h"

namespace py = pybind11;

namespace surogate::bindings {

namespace {

using namespace surogate::serve;

[[noreturn]] void bad_field(const char* owner, const char* field, const std::string& what, const std::string& hint) {
  throw_status(Status(StatusCode::kInvalidArgument, str_cat(owner, " '", field, "' ", what), __FILE__, __LINE__, hint));
}

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

py::object field(py::handle obj, const char* owner, const char* name) {
  if (!py::hasattr(obj, name)) bad_field(owner, name, "is missing", str_cat("pass a ", owner, " with every field"));
  return obj.attr(name);
}

int64_t as_int(py::handle v, const char* owner, const char* name, int64_t lo, int64_t hi) {
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::int_>(v) || py::hasattr(v, "__index__"))) {
    bad_field(owner, name, str_cat("must be an integer, not ", type_name(v)), "");
  }
  const py::int_ i = py::reinterpret_borrow<py::object>(v).attr("__index__")();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || x < lo || x > hi) bad_field(owner, name, str_cat("is out of range [", lo, ", ", hi, "]"), "");
  return x;
}

double as_float(py::handle v, const char* owner, const char* name) {
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v))) {
    bad_field(owner, name, str_cat("must be a number, not ", type_name(v)), "");
  }
  return v.cast<double>();
}

bool as_bool(py::handle v, const char* owner, const char* name) {
  if (!py::isinstance<py::bool_>(v)) bad_field(owner, name, str_cat("must be true or false, not ", type_name(v)), "");
  return v.cast<bool>();
}

std::vector<int32_t> as_token_ids(py::handle v, const char* owner, const char* name) {
  std::vector<int32_t> out;
  if (v.is_none()) return out;
  if (py::isinstance<py::array>(v)) {
    auto arr = py::reinterpret_borrow<py::array>(v);
    if (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u') {
      bad_field(owner, name, "must hold integers", "pass a list of token ids or an int array");
    }
    auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    if (a.ndim() != 1) bad_field(owner, name, "must be one-dimensional", "");
    out.reserve(a.size());
    for (py::ssize_t i = 0; i < a.size(); ++i) {
      const int64_t x = a.data()[i];
      if (x < INT32_MIN || x > INT32_MAX) bad_field(owner, name, str_cat("[", i, "] = ", x, " is not a token id"), "");
      out.push_back(static_cast<int32_t>(x));
    }
    return out;
  }
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v)) {
    bad_field(owner, name, str_cat("must be a list of token ids, not ", type_name(v)), "");
  }
  for (py::handle item : py::reinterpret_borrow<py::sequence>(v)) {
    out.push_back(static_cast<int32_t>(as_int(item, owner, name, INT32_MIN, INT32_MAX)));
  }
  return out;
}

// None -> `none`; otherwise an int in [lo, hi].
int32_t as_optional_int(py::handle v, const char* owner, const char* name, int32_t none, int64_t lo, int64_t hi) {
  return v.is_none() ? none : static_cast<int32_t>(as_int(v, owner, name, lo, hi));
}

// A field added after the first release: absent reads as None (older param objects still work).
py::object optional_field(py::handle obj, const char* name) {
  return py::hasattr(obj, name) ? obj.attr(name) : py::object(py::none());
}

// {token id: bias} -> (token id, bias) pairs in id order.
std::vector<std::pair<int32_t, float>> as_logit_bias(py::handle v, const char* owner) {
  std::vector<std::pair<int32_t, float>> out;
  if (v.is_none()) return out;
  if (!py::isinstance<py::dict>(v)) bad_field(owner, "logit_bias", str_cat("must be a dict, not ", type_name(v)), "");
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(v)) {
    out.emplace_back(static_cast<int32_t>(as_int(key, owner, "logit_bias", INT32_MIN, INT32_MAX)),
                     static_cast<float>(as_float(value, owner, "logit_bias")));
  }
  std::sort(out.begin(), out.end());
  return out;
}

SamplingParams sampling_params_from(py::handle obj) {
  const char* o = "sampling parameter";
  SamplingParams p;
  p.temperature = static_cast<float>(as_float(field(obj, o, "temperature"), o, "temperature"));
  p.top_k = static_cast<int32_t>(as_int(field(obj, o, "top_k"), o, "top_k", INT32_MIN, INT32_MAX));
  p.top_p = static_cast<float>(as_float(field(obj, o, "top_p"), o, "top_p"));
  p.min_p = static_cast<float>(as_float(field(obj, o, "min_p"), o, "min_p"));
  p.repetition_penalty = static_cast<float>(as_float(field(obj, o, "repetition_penalty"), o, "repetition_penalty"));
  p.presence_penalty = static_cast<float>(as_float(field(obj, o, "presence_penalty"), o, "presence_penalty"));
  p.frequency_penalty = static_cast<float>(as_float(field(obj, o, "frequency_penalty"), o, "frequency_penalty"));
  py::object seed = field(obj, o, "seed");
  if (!seed.is_none()) {
    as_int(seed, o, "seed", INT64_MIN, INT64_MAX);  // type check; any 64-bit value is a seed
    p.has_seed = true;
    p.seed = PyLong_AsUnsignedLongLongMask(seed.ptr());
  }
  p.max_tokens = as_optional_int(field(obj, o, "max_tokens"), o, "max_tokens", -1, 1, INT32_MAX);
  p.min_tokens = static_cast<int32_t>(as_int(field(obj, o, "min_tokens"), o, "min_tokens", 0, INT32_MAX));
  p.stop_token_ids = as_token_ids(field(obj, o, "stop_token_ids"), o, "stop_token_ids");
  p.eos_token_ids = as_token_ids(field(obj, o, "eos_token_ids"), o, "eos_token_ids");
  p.ignore_eos = as_bool(field(obj, o, "ignore_eos"), o, "ignore_eos");
  p.logprobs = as_optional_int(field(obj, o, "logprobs"), o, "logprobs", -1, 0, kMaxLogprobs);
  p.prompt_logprobs = as_optional_int(field(obj, o, "prompt_logprobs"), o, "prompt_logprobs", -1, 0, kMaxLogprobs);
  p.logit_bias = as_logit_bias(optional_field(obj, "logit_bias"), o);
  p.constrained = !optional_field(obj, "structured_outputs").is_none();
  p.max_reasoning_tokens =
      as_optional_int(optional_field(obj, "max_reasoning_tokens"), o, "max_reasoning_tokens", -1, 0, INT32_MAX);
  p.reasoning_start_token_id = as_optional_int(optional_field(obj, "reasoning_start_token_id"), o,
                                               "reasoning_start_token_id", -1, 0, INT32_MAX);
  p.reasoning_end_token_id = as_optional_int(optional_field(obj, "reasoning_end_token_id"), o,
                                             "reasoning_end_token_id", -1, 0, INT32_MAX);
  py::object started = optional_field(obj, "reasoning_started");
  p.reasoning_started = !started.is_none() && as_bool(started, o, "reasoning_started");
  p.reasoning_end_ids = as_token_ids(optional_field(obj, "reasoning_end_ids"), o, "reasoning_end_ids");
  return p;
}

EngineConfig engine_config_from(py::handle obj) {
  const char* o = "engine config";
  EngineConfig c;
  c.block_size = static_cast<int>(as_int(field(obj, o, "block_size"), o, "block_size", 1, 1 << 20));
  c.num_blocks = static_cast<int>(as_int(field(obj, o, "num_blocks"), o, "num_blocks", 1, INT32_MAX));
  c.max_num_seqs = static_cast<int>(as_int(field(obj, o, "max_num_seqs"), o, "max_num_seqs", 1, INT32_MAX));
  c.max_num_batched_tokens = static_cast<int>(
      as_int(field(obj, o, "max_num_batched_tokens"), o, "max_num_batched_tokens", 1, INT32_MAX));
  c.max_model_len = as_optional_int(field(obj, o, "max_model_len"), o, "max_model_len", 0, 1, INT32_MAX);
  c.enable_prefix_caching = as_bool(field(obj, o, "enable_prefix_caching"), o, "enable_prefix_caching");
  c.eos_token_ids = as_token_ids(field(obj, o, "eos_token_ids"), o, "eos_token_ids");
  py::object seed = field(obj, o, "seed");
  if (!seed.is_none()) {
    as_int(seed, o, "seed", INT64_MIN, INT64_MAX);
    c.has_seed = true;
    c.seed = PyLong_AsUnsignedLongLongMask(seed.ptr());
  }
  py::object method = optional_field(obj, "speculative_method");
  if (!method.is_none()) {
    if (!py::isinstance<py::str>(method)) {
      bad_field(o, "speculative_method", str_cat("must be a string, not ", type_name(method)), "use 'ngram' or 'draft'");
    }
    c.speculative_method = method.cast<std::string>();
  }
  c.num_speculative_tokens = as_optional_int(optional_field(obj, "num_speculative_tokens"), o,
                                             "num_speculative_tokens", 0, 0, INT32_MAX);
  c.ngram.min_n = as_optional_int(optional_field(obj, "prompt_lookup_min"), o, "prompt_lookup_min", c.ngram.min_n,
                                  INT32_MIN, INT32_MAX);
  c.ngram.max_n = as_optional_int(optional_field(obj, "prompt_lookup_max"), o, "prompt_lookup_max", c.ngram.max_n,
                                  INT32_MIN, INT32_MAX);
  c.speculative_disable_by_batch_size =
      as_optional_int(optional_field(obj, "speculative_disable_by_batch_size"), o,
                      "speculative_disable_by_batch_size", 0, INT32_MIN, INT32_MAX);
  return c;
}

py::tuple logprob_tuple(const TokenLogprob& lp) {
  py::list top;
  for (size_t i = 0; i < lp.top_ids.size(); ++i) top.append(py::make_tuple(lp.top_ids[i], lp.top_logprobs[i]));
  return py::make_tuple(lp.token_id, lp.logprob, lp.rank, top);
}

// In surogate.serve.types.RequestOutput's field order.
py::tuple output_tuple(const RequestOutput& o) {
  py::object logprobs = py::none();
  if (!o.logprobs.empty()) {
    py::list l;
    for (const TokenLogprob& lp : o.logprobs) l.append(logprob_tuple(lp));
    logprobs = l;
  }
  py::object prompt_logprobs = py::none();
  if (o.has_prompt_logprobs) {
    py::list l;
    l.append(py::none());  // the first prompt token has no logprob (as in vLLM)
    for (const TokenLogprob& lp : o.prompt_logprobs) l.append(logprob_tuple(lp));
    prompt_logprobs = l;
  }
  py::object reason = o.finish_reason == FinishReason::kNone ? py::object(py::none())
                                                              : py::object(py::str(finish_reason_name(o.finish_reason)));
  py::object message = o.finish_message.empty() ? py::object(py::none()) : py::object(py::str(o.finish_message));
  py::object stop = o.stop_token_id < 0 ? py::object(py::none()) : py::object(py::int_(o.stop_token_id));
  return py::make_tuple(o.request_id, py::cast(o.new_token_ids), logprobs, prompt_logprobs, reason, message, stop,
                        o.num_prompt_tokens, o.num_cached_tokens, o.num_output_tokens);
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["num_running"] = s.num_running;
  d["num_waiting"] = s.num_waiting;
  d["num_blocks"] = s.blocks.num_blocks;
  d["blocks_used"] = s.blocks.used;
  d["blocks_free"] = s.blocks.free;
  d["blocks_cached"] = s.blocks.cached;
  d["kv_usage"] = s.blocks.kv_usage;
  d["prefix_cache_queries"] = s.blocks.prefix_cache_queries;
  d["prefix_cache_hits"] = s.blocks.prefix_cache_hits;
  d["prompt_tokens"] = s.prompt_tokens;
  d["generation_tokens"] = s.generation_tokens;
  d["num_preemptions"] = s.num_preemptions;
  d["num_steps"] = s.num_steps;
  d["num_finished"] = s.num_finished;
  d["step_seconds"] = s.step_seconds;
  d["model_seconds"] = s.model_seconds;
  d["mask_wait_seconds"] = s.mask_wait_seconds;
  d["check_seconds"] = s.check_seconds;
  d["redraw_seconds"] = s.redraw_seconds;
  d["spec_num_drafts"] = s.spec_num_drafts;
  d["spec_num_draft_tokens"] = s.spec_num_draft_tokens;
  d["spec_num_accepted_tokens"] = s.spec_num_accepted_tokens;
  d["spec_accepted_per_pos"] = py::cast(s.spec_accepted_per_pos);
  d["device_masked_rows"] = s.device_masked_rows;
  d["grammar_checked_rows"] = s.grammar_checked_rows;
  d["grammar_checked_allowed"] = s.grammar_checked_allowed;
  d["last_error"] = s.last_error.empty() ? py::object(py::none()) : py::object(py::str(s.last_error));
  return d;
}

// Request::embeds from a sequence of surogate.serve.types.EmbedSpan (read by attribute: start,
// rows float [n, width], key bytes, bidirectional, optional position_shift); the engine checks them
// against the prompt.
void embeds_from(py::handle spans, Request* r) {
  if (spans.is_none()) return;
  if (!py::isinstance<py::sequence>(spans)) bad_field("argument", "embeds", "must be a sequence of EmbedSpan", "");
  int i = 0;
  for (py::handle sp : py::reinterpret_borrow<py::sequence>(spans)) {
    const std::string owner = str_cat("embeds[", i++, "]");
    const char* o = owner.c_str();
    EmbedSpan e;
    e.start = static_cast<int>(as_int(field(sp, o, "start"), o, "start", 0, INT32_MAX));
    py::object rows = field(sp, o, "rows");
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(rows);
    if (!a) {
      PyErr_Clear();
      bad_field(o, "rows", str_cat("must be a float array [n, hidden_size], not ", type_name(rows)), "");
    }
    if (a.ndim() != 2) bad_field(o, "rows", str_cat("must be 2-D [n, hidden_size], got ", a.ndim(), " dimensions"), "");
    e.len = static_cast<int>(a.shape(0));
    e.rows.assign(a.data(), a.data() + a.size());
    py::object key = field(sp, o, "key");
    if (!key.is_none()) {
      if (!py::isinstance<py::bytes>(key)) bad_field(o, "key", str_cat("must be bytes, not ", type_name(key)), "");
      e.key = key.cast<std::string>();
    }
    e.bidirectional = as_bool(field(sp, o, "bidirectional"), o, "bidirectional");
    if (py::hasattr(sp, "position_shift")) {
      e.position_shift = static_cast<int>(as_int(sp.attr("position_shift"), o, "position_shift", INT32_MIN, INT32_MAX));
    }
    r->embed_widths.push_back(static_cast<int>(a.shape(1)));
    r->embeds.push_back(std::move(e));
  }
}

py::array_t<int32_t> int32_array(const std::vector<int32_t>& v, std::vector<py::ssize_t> shape) {
  return py::array_t<int32_t>(shape, v.data());  // copies
}

// A ModelRunner that calls fn(step: StepInput) -> float32 array [R, V] in Python.
class PyModelRunner : public ModelRunner {
 public:
  PyModelRunner(py::function fn, int vocab_size, int hidden_size)
      : fn_(std::move(fn)), vocab_size_(vocab_size), hidden_size_(hidden_size) {}
  ~PyModelRunner() override {
    if (!Py_IsInitialized()) {
      fn_.release();  // the interpreter is gone: leak rather than touch it
      return;
    }
    py::gil_scoped_acquire gil;
    fn_ = py::object();
  }

  int vocab_size() const override { return vocab_size_; }
  int hidden_size() const override { return hidden_size_; }

  Status run(const StepInput& in, StepOutput* out) override {
    if (!Py_IsInitialized()) {
      return SG_ERROR(StatusCode::kInternal, "the Python model runner outlived the interpreter",
                      "shut the engine down (EngineClient.close()) before the interpreter exits");
    }
    py::gil_scoped_acquire gil;
    try {
      py::object result = fn_(py::cast(in, py::return_value_policy::copy));  // Python may keep it
      auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(result);
      if (!a) {
        PyErr_Clear();
        return SG_ERROR(StatusCode::kInvalidArgument,
                        str_cat("the Python model runner returned ", type_name(result), ", not an array"),
                        "return a float32 numpy array [len(step.logits_rows), vocab_size]");
      }
      std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
      logits_.assign(a.data(), a.data() + a.size());
      out->logits = Tensor::view_of(logits_.data(), DType::kF32, shape);
      out->tokens.clear();
      return Status::OK();
    } catch (py::error_already_set& e) {
      return SG_ERROR(StatusCode::kInternal, str_cat("the Python model runner raised ", e.what()), "");
    }
  }

 private:
  py::object fn_;
  int vocab_size_;
  int hidden_size_;
  std::vector<float> logits_;
};

// A TokenMasker that calls fn(request_ids: list[int], new_tokens: list[list[int]], rows) in
// Python, rows being a writable int32 numpy view [N, W] of the engine's mask buffer (llguidance's
// fill_next_token_bitmask_par writes it in place).
// With check: check(request_ids, new_tokens, candidates, rows) advances each request over its new
// tokens and, when candidates (a list of ints) is not None, returns whether each may come next,
// writing rows[i] (the same view as fill's) with the mask of each it refuses; with candidates
// None (beside the model) it may fill rows[i] for the requests it expects to refuse, returning
// which it filled (or None). Its fifth argument: each request's last checked draw (-1 none yet,
// 0 allowed, 1 refused).
class PyTokenMasker : public TokenMasker {
 public:
  PyTokenMasker(py::function fn, py::object check) : fn_(std::move(fn)), check_(std::move(check)) {}
  ~PyTokenMasker() override {
    if (!Py_IsInitialized()) {
      fn_.release();
      check_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    fn_ = py::object();
    check_ = py::object();
  }

  bool checks_tokens() const override { return !check_.is_none(); }

  Status check(const std::vector<MaskRequest>& requests, const int32_t* candidates, uint8_t* allowed, uint32_t* rows,
               int words) override {
    if (!Py_IsInitialized()) return outlived();
    py::gil_scoped_acquire gil;
    try {
      auto [ids, tokens] = lists(requests);
      py::object cands = py::none(), view = py::none();
      if (candidates != nullptr) cands = py::cast(std::vector<int32_t>(candidates, candidates + requests.size()));
      if (rows != nullptr) view = rows_view(requests.size(), rows, words);
      py::list refused;  // each request's last checked draw: -1 none yet, 0 allowed, 1 refused
      for (const MaskRequest& r : requests) refused.append(py::int_(r.last_refused));
      py::object got = check_(ids, tokens, cands, view, refused);
      // Beside the model: None (nothing filled), or which rows it filled.
      if (candidates == nullptr && (got.is_none() || allowed == nullptr)) return Status::OK();
      auto flags = got.cast<std::vector<bool>>();
      SG_CHECK(flags.size() == requests.size(), StatusCode::kInternal,
               str_cat("the token masker's check returned ", flags.size(), " answers for ", requests.size(), " tokens"),
               "return one bool per candidate");
      for (size_t i = 0; i < flags.size(); ++i) allowed[i] = flags[i] ? 1 : 0;
      return Status::OK();
    } catch (py::error_already_set& e) {
      return raised(e);
    } catch (py::cast_error& e) {
      return SG_ERROR(StatusCode::kInternal, str_cat("the token masker's check returned no list of bools: ", e.what()),
                      "return one bool per candidate");
    }
  }

  Status fill(const std::vector<MaskRequest>& requests, uint32_t* rows, int words) override {
    if (!Py_IsInitialized()) return outlived();
    py::gil_scoped_acquire gil;
    try {
      auto [ids, tokens] = lists(requests);
      fn_(ids, tokens, rows_view(requests.size(), rows, words));
      return Status::OK();
    } catch (py::error_already_set& e) {
      return raised(e);
    }
  }

 private:
  static Status outlived() {
    return SG_ERROR(StatusCode::kInternal, "the Python token masker outlived the interpreter",
                    "shut the engine down (EngineClient.close()) before the interpreter exits");
  }
  static Status raised(const py::error_already_set& e) {
    return SG_ERROR(StatusCode::kInternal, str_cat("the grammar (token masker) raised ", e.what()),
                    "check the request's response_format / structured_outputs");
  }
  // (request ids, their new tokens), as Python lists; under the GIL.
  static std::pair<py::list, py::list> lists(const std::vector<MaskRequest>& requests) {
    py::list ids, tokens;
    for (const MaskRequest& r : requests) {
      ids.append(py::int_(r.request_id));
      tokens.append(py::cast(r.new_tokens));
    }
    return {ids, tokens};
  }
  // int32 [n, words] over rows: no copy and no owner (a base of None), a view valid during the call.
  static py::array_t<int32_t> rows_view(size_t n, uint32_t* rows, int words) {
    const auto w = static_cast<py::ssize_t>(words), es = static_cast<py::ssize_t>(sizeof(int32_t));
    return py::array_t<int32_t>({static_cast<py::ssize_t>(n), w}, {w * es, es}, reinterpret_cast<int32_t*>(rows),
                                py::none());
  }

  py::object fn_;
  py::object check_;
};

// A Python object held from native code: released under the GIL, leaked after interpreter exit.
std::shared_ptr<void> hold_py(py::object obj) {
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) {
    auto* o = static_cast<py::object*>(p);
    if (!Py_IsInitialized()) {
      o->release();
    } else {
      py::gil_scoped_acquire gil;
      delete o;
      return;
    }
    delete o;
  });
}

std::vector<int32_t> int32_vector(py::handle obj, const char* name) {
  auto a = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) {
    PyErr_Clear();
    bad_field("StepInput", name, "must be an array of integers", "");
  }
  return std::vector<int32_t>(a.data(), a.data() + a.size());
}

// Engines whose thread was started. At interpreter exit (atexit, before finalization) they are
// shut down, since their thread may be about to call a Python runner.
std::mutex g_live_mu;
std::unordered_set<Engine*> g_live_engines;

void shutdown_live_engines() {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (Engine* e : g_live_engines) e->shutdown();
}

// Dropping the last reference to an engine joins its thread, which may be waiting for the GIL
// inside a PyModelRunner: release it first.
struct EngineDeleter {
  void operator()(Engine* e) const {
    auto drop = [e] {
      {
        std::lock_guard<std::mutex> lock(g_live_mu);
        g_live_engines.erase(e);
      }
      delete e;
    };
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      drop();
    } else {
      drop();
    }
  }
};

std::vector<float> row_from(const py::array_t<float, py::array::c_style | py::array::forcecast>& a, int* vocab) {
  if (a.ndim() != 1 || a.size() == 0) {
    throw_status(SG_ERROR(StatusCode::kShapeMismatch, "logits must be a non-empty 1-D float array [V]", ""));
  }
  *vocab = static_cast<int>(a.size());
  return std::vector<float>(a.data(), a.data() + a.size());
}

std::vector<int32_t> context_of(py::handle prompt, py::handle output, int* num_prompt) {
  std::vector<int32_t> ids = as_token_ids(prompt, "argument", "prompt_ids");
  *num_prompt = static_cast<int>(ids.size());
  std::vector<int32_t> out = as_token_ids(output, "argument", "output_ids");
  ids.insert(ids.end(), out.begin(), out.end());
  return ids;
}

}  // namespace

void bind_serve(py::module_& parent) {
  py::module_ m = parent.def_submodule("serve", "The continuous-batching inference engine");

  py::class_<StepInput>(m, "StepInput", "One step's work for the model runner (see serve/model_runner.h).")
      .def_readonly("block_size", &StepInput::block_size)
      .def_readonly("num_tokens", &StepInput::num_tokens)
      .def_readonly("num_seqs", &StepInput::num_seqs)
      .def_readonly("max_blocks_per_seq", &StepInput::max_blocks_per_seq)
      .def_readonly("max_query_len", &StepInput::max_query_len)
      .def_readonly("max_context_len", &StepInput::max_context_len)
      .def_property_readonly("token_ids", [](const StepInput& s) { return int32_array(s.token_ids, {s.num_tokens}); })
      .def_property_readonly("positions", [](const StepInput& s) { return int32_array(s.positions, {s.num_tokens}); })
      .def_property_readonly("slot_mapping",
                             [](const StepInput& s) { return int32_array(s.slot_mapping, {s.num_tokens}); })
      .def_property_readonly("cu_q", [](const StepInput& s) { return int32_array(s.cu_q, {s.num_seqs + 1}); })
      .def_property_readonly("context_lens",
                             [](const StepInput& s) { return int32_array(s.context_lens, {s.num_seqs}); })
      .def_property_readonly("block_tables", [](const StepInput& s) {
        return int32_array(s.block_tables, {s.num_seqs, s.max_blocks_per_seq});
      })
      .def_property_readonly("logits_rows",
                             [](const StepInput& s) { return int32_array(s.logits_rows, {s.num_logits_rows()}); })
      .def_property_readonly("adapter_ids", [](const StepInput& s) { return int32_array(s.adapter_ids, {s.num_seqs}); })
      .def_property_readonly("state_slots", [](const StepInput& s) {
        return int32_array(s.state_slots, {static_cast<int64_t>(s.state_slots.size())});
      })
      .def_property_readonly("request_ids", [](const StepInput& s) {
        return py::array_t<int64_t>({static_cast<py::ssize_t>(s.num_seqs)}, s.request_ids.data());
      })
      .def_property_readonly("need_logits", [](const StepInput& s) {
        return py::array_t<uint8_t>({static_cast<py::ssize_t>(s.need_logits.size())}, s.need_logits.data());
      })
      .def_property_readonly("embed_index", [](const StepInput& s) {
        return int32_array(s.embed_index, {s.num_embed_rows()});
      })
      .def_property_readonly("embed_rows", [](const StepInput& s) {
        return py::array_t<float>({static_cast<py::ssize_t>(s.num_embed_rows()), static_cast<py::ssize_t>(s.embed_width)},
                                  s.embed_rows.data());
      })
      .def_property_readonly("kv_limit", [](const StepInput& s) {
        return int32_array(s.kv_limit, {static_cast<int64_t>(s.kv_limit.size())});
      })
      .def_property_readonly("sample_params", [](const StepInput& s) {
        return py::array_t<float>({static_cast<py::ssize_t>(s.sample_params.size() / kSampleParamCols),
                                   static_cast<py::ssize_t>(kSampleParamCols)}, s.sample_params.data());
      })
      .def_readonly("device_logprobs", &StepInput::device_logprobs)
      .def_static("make", [](py::handle token_ids, py::handle positions, py::handle slot_mapping, py::handle cu_q,
                             py::handle context_lens, py::handle block_tables, py::handle logits_rows,
                             py::handle adapter_ids, py::handle need_logits, int block_size, py::handle sample_params) {
             StepInput s;
             s.block_size = block_size;
             s.token_ids = int32_vector(token_ids, "token_ids");
             s.positions = int32_vector(positions, "positions");
             s.slot_mapping = int32_vector(slot_mapping, "slot_mapping");
             s.cu_q = int32_vector(cu_q, "cu_q");
             s.context_lens = int32_vector(context_lens, "context_lens");
             s.block_tables = int32_vector(block_tables, "block_tables");
             s.logits_rows = int32_vector(logits_rows, "logits_rows");
             s.num_tokens = static_cast<int32_t>(s.token_ids.size());
             s.num_seqs = static_cast<int32_t>(s.context_lens.size());
             if (s.positions.size() != s.token_ids.size() || s.slot_mapping.size() != s.token_ids.size() ||
                 s.cu_q.size() != s.context_lens.size() + 1 || s.cu_q.back() != s.num_tokens ||
                 (s.num_seqs > 0 && s.block_tables.size() % s.num_seqs != 0)) {
               bad_field("StepInput", "arrays", "have inconsistent lengths",
                         "T token ids / positions / slots, S context lens, S + 1 cu_q ending at T, S x B block tables");
             }
             s.max_blocks_per_seq = s.num_seqs ? static_cast<int32_t>(s.block_tables.size() / s.num_seqs) : 0;
             for (int i = 0; i < s.num_seqs; ++i) {
               s.max_query_len = std::max(s.max_query_len, s.cu_q[i + 1] - s.cu_q[i]);
               s.max_context_len = std::max(s.max_context_len, s.context_lens[i]);
             }
             s.adapter_ids = adapter_ids.is_none() ? std::vector<int32_t>(s.num_seqs, -1)
                                                   : int32_vector(adapter_ids, "adapter_ids");
             if (!need_logits.is_none()) {
               for (int32_t v : int32_vector(need_logits, "need_logits")) s.need_logits.push_back(v ? 1 : 0);
             }
             if (static_cast<int>(s.adapter_ids.size()) != s.num_seqs ||
                 (!s.need_logits.empty() && s.need_logits.size() != s.logits_rows.size())) {
               bad_field("StepInput", "adapter_ids / need_logits", "do not have one entry per sequence / logits row", "");
             }
             if (!sample_params.is_none()) {
               auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(sample_params);
               if (!a || a.ndim() != 2 || a.shape(0) != static_cast<py::ssize_t>(s.logits_rows.size()) ||
                   a.shape(1) != kSampleParamCols) {
                 bad_field("StepInput", "sample_params", "must be float32 [len(logits_rows), 8]",
                           "one sample op params row per logits row (runtime/op_checks_sample.h)");
               }
               s.sample_params.assign(a.data(), a.data() + a.size());
             }
             s.request_ids.assign(s.num_seqs, 0);
             return s;
           },
           py::arg("token_ids"), py::arg("positions"), py::arg("slot_mapping"), py::arg("cu_q"),
           py::arg("context_lens"), py::arg("block_tables"), py::arg("logits_rows"), py::arg("adapter_ids") = py::none(),
           py::arg("need_logits") = py::none(), py::arg("block_size") = 16, py::arg("sample_params") = py::none(),
           "A step built by hand (tests, benchmarks); block_tables flattened [S * B]; sample_params float32 [R, 8] "
           "(none: every row's token the argmax).")
      .def("__repr__", [](const StepInput& s) {
        return str_cat("StepInput(tokens=", s.num_tokens, ", seqs=", s.num_seqs, ", logits_rows=", s.num_logits_rows(),
                       ")");
      });

  py::class_<ModelRunner, std::shared_ptr<ModelRunner>>(m, "ModelRunner",
                                                         "A model as the engine drives it; see PyModelRunner.")
      .def_property_readonly("vocab_size", &ModelRunner::vocab_size)
      .def("run", [](ModelRunner& r, const StepInput& in, bool with_logits) {
             StepOutput out;
             Status st;
             {
               py::gil_scoped_release nogil;
               st = r.run(in, &out);
             }
             check(st);
             const Tensor& t = out.logits;
             py::array_t<float> logits({with_logits ? t.shape[0] : 0, t.shape[1]});
             for (int64_t i = 0; with_logits && i < t.shape[0]; ++i) {
               std::memcpy(logits.mutable_data(i), t.ptr<float>() + i * t.strides[0], t.shape[1] * sizeof(float));
             }
             return py::make_tuple(logits, py::array_t<int32_t>(static_cast<py::ssize_t>(out.tokens.size()),
                                                                out.tokens.data()));
           }, py::arg("step"), py::arg("logits") = true,
           "One step outside an engine: (logits float32 [R, V], tokens int32 [R] or empty: each row's argmax, or its "
           "draw under step.sample_params on a runner that samples on its device). Rows whose need_logits is 0 may "
           "be left unfilled when tokens are given; logits=False returns none (timing).");

  py::class_<PyModelRunner, ModelRunner, std::shared_ptr<PyModelRunner>>(
      m, "PyModelRunner", "A ModelRunner calling fn(step: StepInput) -> float32 [R, V] logits, with the GIL held.")
      .def(py::init([](py::function fn, int vocab_size, int hidden_size) {
             if (vocab_size <= 0 || hidden_size < 0) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                     str_cat("vocab_size is ", vocab_size, ", hidden_size ", hidden_size), ""));
             }
             return std::make_shared<PyModelRunner>(std::move(fn), vocab_size, hidden_size);
           }),
           py::arg("fn"), py::arg("vocab_size"), py::arg("hidden_size") = 0,
           "hidden_size: the width of the embedding rows it takes (StepInput.embed_rows); 0: none");

  py::class_<ProgramRunner, ModelRunner, std::shared_ptr<ProgramRunner>>(
      m, "ProgramRunner",
      "The ModelRunner of a compiled model: pads each step to a shape bucket and runs that bucket's Program "
      "natively (see serve/program_runner.h). compile(T, S, B, R, adapter, E) -> an object whose .program is the "
      "bucket's Program, called with the GIL the first time a bucket is met.")
      .def(py::init([](const std::string& device, int vocab_size, int block_size, int num_blocks, int pad_blocks,
                       py::function compile, int hidden_size) {
             if (vocab_size <= 0 || block_size <= 0 || num_blocks <= 0 || pad_blocks < 0 || hidden_size < 0) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                     str_cat("ProgramRunner: vocab_size ", vocab_size, ", block_size ", block_size,
                                             ", num_blocks ", num_blocks, ", pad_blocks ", pad_blocks),
                                     "all positive (pad_blocks >= 0)"));
             }
             ProgramRunner::Config cfg{parse_device(device), vocab_size, block_size, num_blocks, pad_blocks,
                                       hidden_size};
             std::shared_ptr<void> fn = hold_py(std::move(compile));
             auto cf = [fn](const BucketKey& k, Program** out, std::shared_ptr<void>* owner) -> Status {
               if (!Py_IsInitialized()) {
                 return SG_ERROR(StatusCode::kInternal, "the step compiler outlived the interpreter",
                                 "shut the engine down before the interpreter exits");
               }
               py::gil_scoped_acquire gil;
               try {
                 py::object exe = (*static_cast<py::object*>(fn.get()))(k.T, k.S, k.B, k.R, k.adapter, k.E);
                 *out = exe.attr("program").cast<Program*>();
                 *owner = hold_py(std::move(exe));
                 return Status::OK();
               } catch (py::error_already_set& e) {
                 return SG_ERROR(StatusCode::kInternal, str_cat("compiling the step Program raised ", e.what()), "");
               } catch (py::cast_error& e) {
                 return SG_ERROR(StatusCode::kInternal, str_cat("the step compiler returned no Program: ", e.what()), "");
               }
             };
             return std::make_shared<ProgramRunner>(cfg, std::move(cf));
           }),
           py::arg("device"), py::arg("vocab_size"), py::arg("block_size"), py::arg("num_blocks"),
           py::arg("pad_blocks"), py::arg("compile"), py::arg("hidden_size") = 0)
      .def("forget", &ProgramRunner::forget, py::arg("adapter"), py::call_guard<py::gil_scoped_release>(),
           "Drop the Programs of one adapter slot (-1: the base model, -2: all).")
      .def_property_readonly("num_programs", &ProgramRunner::num_programs)
      .def("bucket_key", [](const ProgramRunner& r, const StepInput& in, int adapter) {
             const BucketKey k = r.bucket_key(in, adapter);
             return py::make_tuple(k.T, k.S, k.B, k.R, k.adapter, k.E);
           }, py::arg("step"), py::arg("adapter") = -1,
           "(T, S, B, R, adapter, E): the bucket a step of one adapter runs in (what compile is asked for).")
      .def_static("bucket_tokens", &ProgramRunner::bucket_tokens, py::arg("t"))
      .def_property_readonly_static("MAX_PAD", [](py::object) { return ProgramRunner::kMaxPad; });

  py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>(m, "Engine")
      .def(py::init([](std::shared_ptr<ModelRunner> runner, py::handle config, std::shared_ptr<ModelRunner> draft) {
             std::unique_ptr<Engine> e;
             check(Engine::create(engine_config_from(config), std::move(runner), &e, std::move(draft)));
             return e.release();
           }),
           py::arg("runner"), py::arg("config"), py::arg("draft") = nullptr,
           "draft: the draft model's runner (speculative_method 'draft'), its KV cache of the engine's blocks.")
      .def("submit", [](Engine& e, py::handle prompt_ids, py::handle params, int adapter_id, py::handle embeds) {
             Request r;
             r.prompt_token_ids = as_token_ids(prompt_ids, "argument", "prompt_ids");
             r.params = sampling_params_from(params);
             r.adapter_id = adapter_id;
             embeds_from(embeds, &r);
             uint64_t id = 0;
             check(e.submit(std::move(r), &id));
             return id;
           },
           py::arg("prompt_ids"), py::arg("params"), py::arg("adapter_id") = -1, py::arg("embeds") = py::none(),
           "embeds: EmbedSpan-like objects (start, rows [n, hidden], key bytes, bidirectional)")
      .def("abort", &Engine::abort, py::arg("request_id"))
      .def("hold", &Engine::hold, "Take no new step until release() (a batch of submits all reach the first step).")
      .def("release", &Engine::release)
      .def("reset_prefix_cache", &Engine::reset_prefix_cache, py::call_guard<py::gil_scoped_release>(),
           "Forget every cached prefix (between steps); returns how many blocks left the cache.")
      .def("set_token_masker", [](Engine& e, py::function fn, py::object check) {
             if (e.running()) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument, "set_token_masker on a running engine",
                                     "set it before start()"));
             }
             e.set_token_masker(std::make_shared<PyTokenMasker>(std::move(fn), std::move(check)));
           },
           py::arg("fn"), py::arg("check") = py::none(),
           "fn(request_ids, new_tokens, rows): advance each request's grammar over its new answer tokens "
           "and write the allowed-token bitmask into rows[i] (int32 [N, ceil(V/32)]); before start(). "
           "check(request_ids, new_tokens, candidates, rows, refused), optional: advance likewise and, when "
           "candidates is not None, return a list of bools (candidate i may come next, as its mask would say) "
           "and write rows[i] with the mask of each refused one; with candidates None (beside the model), fill "
           "rows[i] for the requests whose draw it expects refused and return which it filled (or None). "
           "refused[i]: request i's last checked draw (-1 none yet, 0 allowed, 1 refused). The engine then "
           "needs masks only for the draws the grammar refuses (serve/token_mask.h).")
      .def("start", [](Engine& e) {
        check(e.start());
        std::lock_guard<std::mutex> lock(g_live_mu);
        g_live_engines.insert(&e);
      })
      .def("shutdown", &Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("step", [](Engine& e) {
        Status st;
        {
          py::gil_scoped_release nogil;
          st = e.step();
        }
        check(st);
      })
      .def("poll", [](Engine& e, double timeout) {
             std::vector<RequestOutput> outs;
             {
               py::gil_scoped_release nogil;
               outs = e.poll(timeout);
             }
             py::list l;
             for (const RequestOutput& o : outs) l.append(output_tuple(o));
             return l;
           },
           py::arg("timeout") = 0.0,
           "Outputs queued since the last poll, as RequestOutput field tuples; waits up to `timeout` seconds "
           "(< 0: until some arrive) when there are none.")
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); })
      .def_property_readonly("running", &Engine::running)
      .def_property_readonly("vocab_size", &Engine::vocab_size)
      .def_property_readonly("max_model_len", [](const Engine& e) { return e.config().max_model_len; });

  py::module_::import("atexit").attr("register")(py::cpp_function(&shutdown_live_engines));

  // The sampler on one logits row, for tests and offline checks.
  m.def("apply_penalties", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, py::handle params,
                              py::handle prompt_ids, py::handle output_ids) {
          int V = 0, P = 0;
          std::vector<float> row = row_from(logits, &V);
          std::vector<int32_t> ids = context_of(prompt_ids, output_ids, &P);
          SamplingParams p = sampling_params_from(params);
          check(p.validate(V));
          for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] < 0 || ids[i] >= V) bad_field("argument", "token ids", str_cat(ids[i], " is out of range"), "");
          }
          Sampler(V).apply_penalties(row.data(), p, ids, P);
          return py::array_t<float>({static_cast<py::ssize_t>(V)}, row.data());
        },
        py::arg("logits"), py::arg("params"), py::arg("prompt_ids"), py::arg("output_ids"),
        "The row after min_tokens masking and the repetition / frequency / presence penalties.");
  m.def("sample", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, py::handle params,
                     py::handle prompt_ids, py::handle output_ids, int n, py::handle allowed_mask) {
          int V = 0, P = 0;
          std::vector<float> row = row_from(logits, &V);
          std::vector<int32_t> ids = context_of(prompt_ids, output_ids, &P);
          SamplingParams p = sampling_params_from(params);
          check(p.validate(V));
          for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] < 0 || ids[i] >= V) bad_field("argument", "token ids", str_cat(ids[i], " is out of range"), "");
          }
          std::vector<uint32_t> mask;
          if (!allowed_mask.is_none()) {
            auto a = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(allowed_mask);
            if (!a || a.ndim() != 1 || a.size() != mask_words(V)) {
              bad_field("argument", "allowed_mask", str_cat("must be int32 [", mask_words(V), "] (ceil(V / 32) words)"),
                        "");
            }
            const auto* words = reinterpret_cast<const uint32_t*>(a.data());
            mask.assign(words, words + a.size());
          }
          const uint32_t* allowed = mask.empty() ? nullptr : mask.data();
          std::vector<int32_t> out(std::max(n, 0));
          Sampler sampler(V);
          Status st;
          {
            py::gil_scoped_release nogil;
            for (size_t k = 0; k < out.size(); ++k) {  // draw k: step len(output_ids) + k
              st = sampler.sample(row.data(), p, ids, P, p.seed, static_cast<uint32_t>(ids.size() - P + k), &out[k],
                                  allowed);
              if (!st.ok()) break;
            }
          }
          check(st);
          return py::array_t<int32_t>({static_cast<py::ssize_t>(out.size())}, out.data());
        },
        py::arg("logits"), py::arg("params"), py::arg("prompt_ids"), py::arg("output_ids"), py::arg("n") = 1,
        py::arg("allowed_mask") = py::none(),
        "n draws from one row under params.seed (0 when unset) at steps len(output_ids) .. + n - 1; allowed_mask: a "
        "grammar's bitmask row (int32 [ceil(V/32)]), bit t%32 of word t/32 = token t allowed.");
  m.def("needs_logits", [](py::handle params, py::handle prompt_ids, py::handle output_ids, bool device_samples) {
          int P = 0;
          std::vector<int32_t> ids = context_of(prompt_ids, output_ids, &P);
          Sequence seq(0, std::vector<int32_t>(ids.begin(), ids.begin() + P), sampling_params_from(params), -1, 0);
          seq.token_ids = ids;
          return Sampler::needs_logits(seq, device_samples);
        },
        py::arg("params"), py::arg("prompt_ids"), py::arg("output_ids"), py::arg("device_samples") = true,
        "Whether the next token's logits row goes to the host (Sampler::needs_logits), with a runner that "
        "samples on its device or not.");
  m.def("logprob", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, int token, int top_n) {
          int V = 0;
          std::vector<float> row = row_from(logits, &V);
          if (token < 0 || token >= V) bad_field("argument", "token", str_cat(token, " is out of range"), "");
          return logprob_tuple(Sampler(V).logprob(row.data(), token, top_n));
        },
        py::arg("logits"), py::arg("token"), py::arg("top_n") = 0,
        "(token, logprob, rank, [(id, logprob), ...]) under log_softmax(logits).");
}

}  // namespace surogate::bindings
