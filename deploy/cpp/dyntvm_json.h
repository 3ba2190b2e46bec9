// Small read-only access to the JSON of an artifact (manifest.json, graph.json), over tvm_ffi's JSON parser.
#ifndef DYNTVM_JSON_H_
#define DYNTVM_JSON_H_

#include <tvm/ffi/extra/json.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dyntvm_deploy.h"

namespace dyntvm {

class Json {
 public:
  Json() = default;
  explicit Json(tvm::ffi::Any v) : v_(std::move(v)) {}

  static Json Parse(const std::string& text, const std::string& what) {
    tvm::ffi::String err;
    tvm::ffi::Any v = tvm::ffi::json::Parse(text, &err);
    if (!err.empty()) throw Error(what + " is not valid JSON: " + std::string(err));
    return Json(v);
  }

  bool IsNull() const { return v_ == nullptr; }
  bool IsArray() const { return v_.as<tvm::ffi::json::Array>().has_value(); }
  bool IsObject() const { return v_.as<tvm::ffi::json::Object>().has_value(); }
  bool IsString() const { return v_.as<tvm::ffi::String>().has_value(); }
  bool IsInt() const { return v_.type_index() == kTVMFFIInt; }

  bool Has(const std::string& key) const {
    auto obj = v_.as<tvm::ffi::json::Object>();
    return obj && obj->count(tvm::ffi::String(key));
  }
  Json operator[](const std::string& key) const {
    auto obj = v_.as<tvm::ffi::json::Object>();
    if (!obj) throw Error("expected a JSON object holding " + key);
    auto it = obj->find(tvm::ffi::String(key));
    if (it == obj->end()) throw Error("missing JSON field " + key);
    return Json((*it).second);
  }
  size_t size() const { return Arr().size(); }
  Json operator[](size_t i) const { return Json(Arr()[i]); }

  std::string Str() const {
    auto s = v_.as<tvm::ffi::String>();
    if (!s) throw Error("expected a JSON string, got " + v_.GetTypeKey());
    return std::string(*s);
  }
  int64_t Int() const {
    if (v_.type_index() == kTVMFFIBool) return v_.cast<bool>() ? 1 : 0;
    if (!IsInt()) throw Error("expected a JSON integer, got " + v_.GetTypeKey());
    return v_.cast<int64_t>();
  }
  bool Bool() const { return Int() != 0; }
  // an attr holding a tuple ({"tuple": [...]}), a list or one int, as ints
  std::vector<int64_t> Ints() const {
    Json list = IsObject() && Has("tuple") ? (*this)["tuple"] : *this;
    std::vector<int64_t> out;
    if (!list.IsArray()) {
      out.push_back(list.Int());
      return out;
    }
    for (size_t i = 0; i < list.size(); ++i) out.push_back(list[i].Int());
    return out;
  }

 private:
  tvm::ffi::json::Array Arr() const {
    auto a = v_.as<tvm::ffi::json::Array>();
    if (!a) throw Error("expected a JSON array, got " + v_.GetTypeKey());
    return *a;
  }
  tvm::ffi::Any v_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace dyntvm

#endif  // DYNTVM_JSON_H_
