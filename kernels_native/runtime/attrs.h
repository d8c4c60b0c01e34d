// Attrs: the named scalar / list attributes an op instruction carries (eps, causal, window...).
// Small and flat: a Program's instructions are built once, and kernels read a handful of keys.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace surogate {

class Attrs {
 public:
  using Value = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

  void set(std::string name, Value v) {
    for (auto& kv : items_) {
      if (kv.first == name) { kv.second = std::move(v); return; }
    }
    items_.emplace_back(std::move(name), std::move(v));
  }
  bool has(const std::string& name) const { return find(name) != nullptr; }

  int64_t get_int(const std::string& name, int64_t dflt) const {
    const Value* v = find(name);
    if (!v) return dflt;
    if (auto p = std::get_if<int64_t>(v)) return *p;
    if (auto p = std::get_if<double>(v)) return static_cast<int64_t>(*p);
    return dflt;
  }
  double get_float(const std::string& name, double dflt) const {
    const Value* v = find(name);
    if (!v) return dflt;
    if (auto p = std::get_if<double>(v)) return *p;
    if (auto p = std::get_if<int64_t>(v)) return static_cast<double>(*p);
    return dflt;
  }
  bool get_bool(const std::string& name, bool dflt) const { return get_int(name, dflt ? 1 : 0) != 0; }
  std::vector<int64_t> get_ints(const std::string& name) const {
    const Value* v = find(name);
    if (!v) return {};
    if (auto p = std::get_if<std::vector<int64_t>>(v)) return *p;
    if (auto p = std::get_if<int64_t>(v)) return {*p};
    return {};
  }
  std::string get_str(const std::string& name, const std::string& dflt) const {
    const Value* v = find(name);
    if (!v) return dflt;
    if (auto p = std::get_if<std::string>(v)) return *p;
    return dflt;
  }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  const Value* find(const std::string& name) const {
    for (const auto& kv : items_) {
      if (kv.first == name) return &kv.second;
    }
    return nullptr;
  }
  std::vector<std::pair<std::string, Value>> items_;
};

}  // namespace surogate
