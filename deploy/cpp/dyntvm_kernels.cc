// The dynamic-shape ops a VM program calls back for (`dyntvm.vm_kernel`), as C++ kernels: the same results as
// dyntvm's numpy kernels (runtime/kernels.py) for the ops listed in `Kernels()`. A model needing another op is
// refused when it is loaded, naming the op and node.
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "dyntvm_deploy.h"
#include "dyntvm_json.h"

namespace dyntvm {
namespace detail {

namespace ffi = tvm::ffi;
using Tensors = std::vector<ffi::Tensor>;
using Shape = std::vector<int64_t>;
using KernelFn = Tensors (*)(const Json& attrs, const Tensors& ins);

namespace {

Shape ShapeOf(const ffi::Tensor& t) { return Shape(t.shape().begin(), t.shape().end()); }
size_t ElemBytes(const ffi::Tensor& t) { return (t.dtype().bits * t.dtype().lanes + 7) / 8; }
char* Ptr(const ffi::Tensor& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }
int64_t Prod(const Shape& s, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t k = from; k < std::min(to, s.size()); ++k) p *= s[k];
  return p;
}
int64_t Axis(int64_t axis, int64_t ndim, const char* op) {
  if (axis < -ndim || axis >= ndim || ndim == 0) {
    throw Error(std::string(op) + ": axis " + std::to_string(axis) + " out of range for " + std::to_string(ndim) +
                " dims");
  }
  return axis < 0 ? axis + ndim : axis;
}

// element i of a tensor of any int / float / bool dtype, as double (k values, steps, truthiness)
double Value(const ffi::Tensor& t, int64_t i) {
  const char* p = Ptr(t);
  DLDataType d = t.dtype();
  if (d.code == kDLFloat && d.bits == 32) return reinterpret_cast<const float*>(p)[i];
  if (d.code == kDLFloat && d.bits == 64) return reinterpret_cast<const double*>(p)[i];
  if (d.code == kDLInt && d.bits == 64) return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  if (d.code == kDLInt && d.bits == 32) return reinterpret_cast<const int32_t*>(p)[i];
  if (d.code == kDLInt && d.bits == 16) return reinterpret_cast<const int16_t*>(p)[i];
  if (d.code == kDLInt && d.bits == 8) return reinterpret_cast<const int8_t*>(p)[i];
  if ((d.code == kDLUInt || d.code == kDLBool) && d.bits == 8) return reinterpret_cast<const uint8_t*>(p)[i];
  throw Error("unsupported dtype " + DTypeName(d));
}
int64_t IntAt(const ffi::Tensor& t, int64_t i) {
  DLDataType d = t.dtype();
  if (d.code == kDLInt && d.bits == 64) return reinterpret_cast<const int64_t*>(Ptr(t))[i];  // exact past 2^53
  return static_cast<int64_t>(Value(t, i));
}
bool Truthy(const ffi::Tensor& t, int64_t i) { return Value(t, i) != 0.0; }   // NaN is true, as in numpy

// Python's slice(start, stop, step).indices(n): (first index, length)
std::pair<int64_t, int64_t> SliceRange(int64_t start, int64_t stop, int64_t step, int64_t n) {
  if (step == 0) throw Error("slice: a step is 0");
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
  auto clamp = [&](int64_t v) {
    if (v < 0) v = v < -n ? lower : v + n;
    return std::min(std::max(v, lower), upper);
  };
  int64_t a = clamp(start), b = clamp(stop);
  int64_t len = step > 0 ? (b > a ? (b - a - 1) / step + 1 : 0) : (a > b ? (a - b - 1) / (-step) + 1 : 0);
  return {a, len};
}

// out[i0, i1, ...] = x[first[0] + i0 * step[0], ...]
ffi::Tensor Strided(const ffi::Tensor& x, const Shape& first, const Shape& step, const Shape& out_shape) {
  ffi::Tensor out = EmptyTensor(out_shape, x.dtype());
  int64_t total = Prod(out_shape), nd = static_cast<int64_t>(out_shape.size());
  if (total == 0) return out;
  size_t es = ElemBytes(x);
  Shape in_shape = ShapeOf(x), stride(in_shape.size(), 1);
  for (size_t k = stride.size(); k-- > 1;) stride[k - 1] = stride[k] * in_shape[k];
  Shape idx(nd, 0);
  const char* src = Ptr(x);
  char* dst = Ptr(out);
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (int64_t k = 0; k < nd; ++k) off += (first[k] + idx[k] * step[k]) * stride[k];
    std::memcpy(dst + i * es, src + off * es, es);
    for (int64_t k = nd - 1; k >= 0 && ++idx[k] == out_shape[k]; --k) idx[k] = 0;
  }
  return out;
}

ffi::Tensor SliceAxes(const ffi::Tensor& x, const Shape& axes, const Shape& starts, const Shape& stops,
                      const Shape& steps) {
  Shape shape = ShapeOf(x), first(shape.size(), 0), step(shape.size(), 1), out = shape;
  if (starts.size() != axes.size() || stops.size() != axes.size() || steps.size() != axes.size()) {
    throw Error("slice: " + std::to_string(starts.size()) + " starts, " + std::to_string(stops.size()) +
                " stops and " + std::to_string(steps.size()) + " steps for " + std::to_string(axes.size()) + " axes");
  }
  for (size_t j = 0; j < axes.size(); ++j) {
    int64_t ax = Axis(axes[j], static_cast<int64_t>(shape.size()), "slice");
    auto r = SliceRange(starts[j], stops[j], steps[j], shape[ax]);
    first[ax] = r.first;
    step[ax] = steps[j];
    out[ax] = r.second;
  }
  return Strided(x, first, step, out);
}

Tensors Slice(const Json& a, const Tensors& in) {
  return {SliceAxes(in[0], a["axes"].Ints(), a["starts"].Ints(), a["stops"].Ints(), a["steps"].Ints())};
}

Tensors SliceDyn(const Json& a, const Tensors& in) {
  Shape axes = a["axis"].Ints(), starts, stops, steps;
  if (!(in[1].numel() == in[2].numel() && in[2].numel() == in[3].numel() &&
        in[1].numel() == static_cast<int64_t>(axes.size()))) {
    throw Error("slice: " + std::to_string(in[1].numel()) + " starts, " + std::to_string(in[2].numel()) +
                " stops and " + std::to_string(in[3].numel()) + " steps for " + std::to_string(axes.size()) + " axes");
  }
  for (size_t j = 0; j < axes.size(); ++j) {
    starts.push_back(IntAt(in[1], j));
    stops.push_back(IntAt(in[2], j));
    steps.push_back(IntAt(in[3], j));
  }
  return {SliceAxes(in[0], axes, starts, stops, steps)};
}

ffi::Tensor Reshaped(const ffi::Tensor& x, const Shape& shape) {    // a copy of `x` with another shape
  ffi::Tensor out = EmptyTensor(shape, x.dtype());
  std::memcpy(Ptr(out), Ptr(x), x.numel() * ElemBytes(x));
  return out;
}

Tensors Squeeze(const Json& a, const Tensors& in) {
  Shape shape = ShapeOf(in[0]), out;
  int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> drop(nd, false);
  if (a["axis"].IsNull()) {
    for (int64_t k = 0; k < nd; ++k) drop[k] = shape[k] == 1;
  } else {
    for (int64_t ax : a["axis"].Ints()) {
      int64_t k = Axis(ax, nd, "squeeze");
      if (drop[k]) throw Error("squeeze: repeated axis " + std::to_string(ax));     // as numpy refuses it
      if (shape[k] != 1) throw Error("squeeze: axis " + std::to_string(ax) + " has size " + std::to_string(shape[k]));
      drop[k] = true;
    }
  }
  for (int64_t k = 0; k < nd; ++k) {
    if (!drop[k]) out.push_back(shape[k]);
  }
  return {Reshaped(in[0], out)};
}

Tensors BooleanMask(const Json& a, const Tensors& in) {
  const ffi::Tensor &x = in[0], &mask = in[1];
  Shape shape = ShapeOf(x);
  int64_t ax = Axis(a["axis"].Int(), static_cast<int64_t>(shape.size()), "boolean_mask");
  if (mask.ndim() != 1 || mask.shape()[0] != shape[ax]) {
    throw Error("boolean_mask: mask of length " + std::to_string(mask.ndim() ? mask.shape()[0] : 0) +
                " does not match axis " + std::to_string(ax) + " of size " + std::to_string(shape[ax]));
  }
  int64_t kept = 0;
  for (int64_t i = 0; i < shape[ax]; ++i) kept += Truthy(mask, i);
  Shape out_shape = shape;
  out_shape[ax] = kept;
  ffi::Tensor out = EmptyTensor(out_shape, x.dtype());
  int64_t outer = Prod(shape, 0, ax);
  size_t row = Prod(shape, ax + 1) * ElemBytes(x);
  char* dst = Ptr(out);
  const char* src = Ptr(x);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < shape[ax]; ++i) {
      if (!Truthy(mask, i)) continue;
      std::memcpy(dst, src + (o * shape[ax] + i) * row, row);
      dst += row;
    }
  }
  return {out};
}

Tensors Nonzero(const Json&, const Tensors& in) {
  const ffi::Tensor& x = in[0];
  Shape shape = ShapeOf(x);
  int64_t nd = static_cast<int64_t>(shape.size()), total = x.numel(), count = 0;
  for (int64_t i = 0; i < total; ++i) count += Truthy(x, i);
  ffi::Tensor out = EmptyTensor({nd, count}, DLDataType{kDLInt, 64, 1});
  int64_t* o = reinterpret_cast<int64_t*>(Ptr(out));
  int64_t j = 0;
  for (int64_t i = 0; i < total && nd > 0; ++i) {
    if (!Truthy(x, i)) continue;
    for (int64_t k = nd - 1, f = i; k >= 0; --k) {
      o[k * count + j] = f % shape[k];
      f /= shape[k];
    }
    ++j;
  }
  return {out};
}

template <typename T>
bool Before(T a, T b, bool largest) {      // numpy's stable argsort order of x (or of -x): NaN last
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return largest ? a > b : a < b;
}

template <typename T>
void TopkLines(const ffi::Tensor& x, int64_t ax, int64_t k, bool largest, ffi::Tensor& vals, ffi::Tensor& idx) {
  Shape shape = ShapeOf(x);
  int64_t n = shape[ax], outer = Prod(shape, 0, ax), inner = Prod(shape, ax + 1);
  const T* src = reinterpret_cast<const T*>(Ptr(x));
  T* v = reinterpret_cast<T*>(Ptr(vals));
  int64_t* ix = reinterpret_cast<int64_t*>(Ptr(idx));
  std::vector<int64_t> order(n);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      const T* line = src + o * n * inner + in;
      for (int64_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t p, int64_t q) { return Before(line[p * inner], line[q * inner], largest); });
      for (int64_t j = 0; j < k; ++j) {
        v[(o * k + j) * inner + in] = line[order[j] * inner];
        ix[(o * k + j) * inner + in] = order[j];
      }
    }
  }
}

Tensors TopkWith(const Json& a, const ffi::Tensor& x, int64_t k) {
  Shape shape = ShapeOf(x);
  int64_t ax = Axis(a["axis"].Int(), static_cast<int64_t>(shape.size()), "topk");
  if (k < 0 || k > shape[ax]) {
    throw Error("topk: k=" + std::to_string(k) + " must be in [0, " + std::to_string(shape[ax]) + "] for axis " +
                std::to_string(ax));
  }
  bool largest = a["largest"].Bool();
  Shape out_shape = shape;
  out_shape[ax] = k;
  ffi::Tensor vals = EmptyTensor(out_shape, x.dtype()), idx = EmptyTensor(out_shape, DLDataType{kDLInt, 64, 1});
  DLDataType d = x.dtype();
  if (d.code == kDLFloat && d.bits == 32) TopkLines<float>(x, ax, k, largest, vals, idx);
  else if (d.code == kDLFloat && d.bits == 64) TopkLines<double>(x, ax, k, largest, vals, idx);
  else if (d.code == kDLInt && d.bits == 64) TopkLines<int64_t>(x, ax, k, largest, vals, idx);
  else if (d.code == kDLInt && d.bits == 32) TopkLines<int32_t>(x, ax, k, largest, vals, idx);
  else if ((d.code == kDLUInt || d.code == kDLBool) && d.bits == 8) TopkLines<uint8_t>(x, ax, k, largest, vals, idx);
  else throw Error("topk: unsupported dtype " + DTypeName(d));
  return {vals, idx};
}

Tensors Topk(const Json& a, const Tensors& in) { return TopkWith(a, in[0], a["k"].Int()); }
Tensors TopkDyn(const Json& a, const Tensors& in) {
  if (in[1].numel() != 1) throw Error("topk: k must hold one value, got " + std::to_string(in[1].numel()));
  return TopkWith(a, in[0], IntAt(in[1], 0));
}

const std::map<std::string, KernelFn>& Kernels() {
  static const std::map<std::string, KernelFn> table = {
      {"slice", Slice},     {"slice_dyn", SliceDyn},       {"squeeze", Squeeze}, {"boolean_mask", BooleanMask},
      {"nonzero", Nonzero}, {"topk", Topk},                {"topk_dyn", TopkDyn}};
  return table;
}

struct KernelNode {
  std::string op, name;
  Json attrs;
  KernelFn fn;
  int64_t users = 0;     // the live models that registered it (two loads of one artifact share its keys)
};

std::shared_mutex table_mutex;
std::map<std::string, KernelNode> table;     // "<binding>:<walk index>" -> node

// graph.json's nodes in `Graph.walk` order (depth first through every subgraph), numbered as the program's keys;
// the nodes outside regions that are not control flow are the ones the program calls back for
const char* const kNoCallback[] = {"constant", "region", "cond", "case", "foreach", "while_loop"};

void Walk(const Json& g, bool in_region, int64_t& index, std::vector<std::pair<int64_t, Json>>& callbacks) {
  Json nodes = g["nodes"];
  for (size_t i = 0; i < nodes.size(); ++i) {
    Json n = nodes[i];
    std::string op = n["op"].Str();
    if (!in_region && std::find(std::begin(kNoCallback), std::end(kNoCallback), op) == std::end(kNoCallback)) {
      callbacks.emplace_back(index, n);
    }
    ++index;
    Json subs = n["subgraphs"];
    for (size_t s = 0; s < subs.size(); ++s) Walk(subs[s], in_region || op == "region", index, callbacks);
  }
}

void RunKernel(ffi::PackedArgs args, ffi::Any* rv) {
  std::string key = args[0].cast<ffi::String>();
  KernelNode node;
  {
    std::shared_lock<std::shared_mutex> lock(table_mutex);
    auto it = table.find(key);
    if (it == table.end()) TVM_FFI_THROW(RuntimeError) << "dyntvm: no C++ kernel registered for node key " << key;
    node = it->second;
  }
  Tensors ins;
  for (int i = 1; i < args.size(); ++i) {
    ins.push_back(args[i].cast<ffi::Tensor>());
    if (!ins.back().IsContiguous()) TVM_FFI_THROW(RuntimeError) << node.op << ": a non-contiguous input";
  }
  Tensors outs;
  try {
    outs = node.fn(node.attrs, ins);
  } catch (const Error& e) {
    TVM_FFI_THROW(ValueError) << node.op << " node '" << node.name << "': " << e.what();
  }
  if (outs.size() == 1) {
    *rv = outs[0];
  } else {
    ffi::Array<ffi::Any> res;
    for (auto& t : outs) res.push_back(t);
    *rv = res;
  }
}

}  // namespace

void RegisterCallbacks() {
  static std::once_flag once;
  std::call_once(once, [] {
    ffi::Function::SetGlobal("dyntvm.vm_kernel", ffi::Function::FromPacked(RunKernel), true);
    // the executor's size check before a region whose sizes could exceed memory: here the allocation itself
    // fails (an error from Model::Run, as any failing run-time check)
    ffi::Function::SetGlobal("dyntvm.vm_size_guard", ffi::Function::FromPacked([](ffi::PackedArgs, ffi::Any* rv) {
                               *rv = ffi::Array<ffi::Any>();
                             }), true);
    ffi::Function::SetGlobal("dyntvm.vm_fallback", ffi::Function::FromPacked([](ffi::PackedArgs args, ffi::Any*) {
                               TVM_FFI_THROW(RuntimeError)
                                   << "this call needs dyntvm's Python executor, which the C++ runner does not have: "
                                   << args[0].cast<ffi::String>();
                             }), true);
  });
}

std::vector<std::string> RegisterModelKernels(const std::string& prefix, const std::string& graph_json,
                                              const std::set<int64_t>* required) {
  Json doc = Json::Parse(graph_json, "graph.json");
  std::vector<std::pair<int64_t, Json>> callbacks;
  int64_t index = 0;
  Walk(doc["graph"], false, index, callbacks);
  std::string missing;
  std::map<std::string, KernelNode> found;
  for (auto& [i, n] : callbacks) {
    std::string op = n["op"].Str(), name = n["name"].Str();
    auto it = Kernels().find(op);
    if (it == Kernels().end()) {      // refused only where the program calls it on every run (not: the nodes it
      if (required == nullptr || required->count(i)) {    // runs itself, called back for an error only)
        missing += (missing.empty() ? "" : ", ") + op + " (node '" + name + "')";
      }
      continue;
    }
    found[prefix + ":" + std::to_string(i)] = KernelNode{op, name, n["attrs"], it->second};
  }
  if (!missing.empty()) {
    throw Error("the model's VM program calls dynamic-shape ops without a C++ kernel in deploy/cpp: " + missing);
  }
  std::vector<std::string> keys;
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  for (auto& kv : found) {
    auto it = table.emplace(kv.first, kv.second).first;
    ++it->second.users;
    keys.push_back(kv.first);
  }
  return keys;
}

void ReleaseModelKernels(const std::vector<std::string>& keys) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  for (const std::string& key : keys) {
    auto it = table.find(key);
    if (it != table.end() && --it->second.users == 0) table.erase(it);
  }
}

size_t RegisteredKernels() {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  return table.size();
}

}  // namespace detail
}  // namespace dyntvm
