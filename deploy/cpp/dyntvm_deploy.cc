// dyntvm C++ deployment: the artifact, its signature and the VMs that run its program (dyntvm_deploy.h).
#include "dyntvm_deploy.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>

#include "dyntvm_json.h"

namespace dyntvm {

namespace ffi = tvm::ffi;

namespace {

constexpr int kFormatVersion = 3;            // runtime/artifact.py FORMAT_VERSION this runner reads
constexpr const char* kProgram = "dyntvm_main";
constexpr const char* kBindingFunction = "dyntvm_binding";
constexpr const char* kCallbacksFunction = "dyntvm_callbacks";   // ir/vm_program.py CALLBACKS_FUNCTION
constexpr int kPooledAllocator = 2;          // tvm::runtime::memory::kPooled (what dt.load's VM uses)

TensorSig ParseSig(const Json& j, const std::string& fallback_name) {
  TensorSig s;
  s.name = j.Has("name") ? j["name"].Str() : fallback_name;
  s.dtype = j["dtype"].Str();
  Json shape = j["shape"];
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k].IsString()) {
      s.dims.push_back(-1);
      s.syms.push_back(shape[k].Str());
    } else {
      s.dims.push_back(shape[k].Int());
      s.syms.emplace_back();
    }
  }
  return s;
}

std::string ShapeText(const ffi::Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int k = 0; k < t.ndim(); ++k) s << (k ? "," : "") << t.shape()[k];
  s << "]";
  return s.str();
}

std::string Hex(const ffi::Tensor& t) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  const uint8_t* p = static_cast<const uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

}  // namespace

std::string TensorSig::Describe() const {
  std::ostringstream s;
  s << dtype << "[";
  for (size_t k = 0; k < dims.size(); ++k) s << (k ? "," : "") << (dims[k] < 0 ? syms[k] : std::to_string(dims[k]));
  s << "]";
  return s.str();
}

DLDataType ParseDType(const std::string& name) {
  static const std::map<std::string, DLDataType> table = {
      {"float32", {kDLFloat, 32, 1}}, {"float64", {kDLFloat, 64, 1}}, {"float16", {kDLFloat, 16, 1}},
      {"int64", {kDLInt, 64, 1}},     {"int32", {kDLInt, 32, 1}},     {"int16", {kDLInt, 16, 1}},
      {"int8", {kDLInt, 8, 1}},       {"uint8", {kDLUInt, 8, 1}},     {"bool", {kDLBool, 8, 1}},
      {"uint16", {kDLUInt, 16, 1}},   {"uint32", {kDLUInt, 32, 1}},   {"uint64", {kDLUInt, 64, 1}}};
  auto it = table.find(name);
  if (it == table.end()) throw Error("unsupported dtype " + name);
  return it->second;
}

std::string DTypeName(DLDataType t) {
  if (t.code == kDLBool || (t.code == kDLUInt && t.bits == 1)) return "bool";
  std::string base = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : "?";
  return base + std::to_string(t.bits);
}

namespace {
struct CPUAlloc {                             // 64-byte aligned host memory, as TVM's kernels expect
  void AllocData(DLTensor* t) {
    size_t bytes = (ffi::GetDataSize(*t) + 63) / 64 * 64;
    t->data = std::aligned_alloc(64, bytes ? bytes : 64);
    if (t->data == nullptr) TVM_FFI_THROW(RuntimeError) << "out of memory allocating " << bytes << " bytes";
  }
  void FreeData(DLTensor* t) { std::free(t->data); }
};
}  // namespace

ffi::Tensor EmptyTensor(const std::vector<int64_t>& shape, DLDataType dtype) {
  return ffi::Tensor::FromNDAlloc(CPUAlloc(), ffi::Shape(shape), dtype, DLDevice{kDLCPU, 0});
}

std::shared_ptr<Model> Model::Load(const std::string& path) {
  detail::RegisterCallbacks();               // before any VM is made: a VM looks its callbacks up when made
  auto model = std::shared_ptr<Model>(new Model());
  model->path_ = path;
  Json manifest = Json::Parse(ReadFile(path + "/manifest.json"), path + "/manifest.json");
  int64_t version = manifest["format_version"].Int();
  if (version != kFormatVersion) {
    throw Error(path + ": artifact format " + std::to_string(version) + ", this runner reads format " +
                std::to_string(kFormatVersion) + " (compile the model again with this dyntvm)");
  }
  std::string target = manifest["target"].Str();
  if (target != "cpu") throw Error(path + ": compiled for target " + target + "; the C++ runner runs cpu artifacts");
  Json sig = manifest["signature"];
  for (size_t i = 0; i < sig["inputs"].size(); ++i) model->inputs_.push_back(ParseSig(sig["inputs"][i], ""));
  // Checks dt.load makes that this runner does not yet: refused rather than run on inputs Python refuses
  std::string graph_json = ReadFile(path + "/graph.json");
  if (Json::Parse(graph_json, path + "/graph.json").Has("dim_ranges")) {
    throw Error(path + ": the model has dim ranges (torch.export Dim min / max), which the C++ runner does not "
                "check yet; run it with dt.load / dyntvm run");
  }
  for (const TensorSig& s : model->inputs_) {
    for (const std::string& sym : s.syms) {
      if (!sym.empty() && !std::regex_match(sym, std::regex("[A-Za-z_][A-Za-z0-9_]*"))) {
        throw Error(path + ": input " + s.name + " has the expression dim " + sym + ", which the C++ runner "
                    "does not check yet; run it with dt.load / dyntvm run");
      }
    }
  }
  for (size_t i = 0; i < sig["outputs"].size(); ++i) {
    model->outputs_.push_back(ParseSig(sig["outputs"][i], "output_" + std::to_string(i)));
  }
  try {
    model->lib_ = ffi::Module::LoadFromFile(path + "/kernels.so");
  } catch (const ffi::Error& e) {
    throw Error(path + "/kernels.so: cannot load the kernel library: " + e.what());
  }
  std::unique_ptr<VM> vm = model->MakeVM();  // also checks the library has the program
  auto binding = vm->exec->GetFunction(kBindingFunction);
  if (!binding.has_value()) throw Error(path + "/kernels.so has no " + std::string(kBindingFunction));
  std::string prefix = Hex((*binding)().cast<ffi::Tensor>());
  // the nodes the program calls back on every run need C++ kernels; a library without the list: every one
  std::set<int64_t> required;
  auto callbacks = vm->exec->GetFunction(kCallbacksFunction);
  if (callbacks.has_value()) {
    for (int64_t i : (*callbacks)().cast<ffi::Shape>()) required.insert(i);
  }
  model->kernel_keys_ =
      detail::RegisterModelKernels(prefix, graph_json, callbacks.has_value() ? &required : nullptr);
  model->pool_.push_back(std::move(vm));
  return model;
}

Model::~Model() { detail::ReleaseModelKernels(kernel_keys_); }

std::unique_ptr<Model::VM> Model::MakeVM() const {
  auto load = (*lib_)->GetFunction("vm_load_executable");
  if (!load.has_value()) throw Error(path_ + "/kernels.so is not a Relax VM library");
  ffi::Module exec = (*load)().cast<ffi::Module>();
  auto init = exec->GetFunction("vm_initialization");
  (*init)(static_cast<int>(kDLCPU), 0, kPooledAllocator);
  auto main = exec->GetFunction(kProgram);
  if (!main.has_value()) {
    throw Error(path_ + ": the kernel library has no VM program (" + kProgram +
                "): the model has nodes the program cannot run, listed by `dyntvm inspect` under "
                "\"vm program: no\"; only Python's executor runs it");
  }
  return std::unique_ptr<VM>(new VM{exec, *main});
}

void Model::CheckInputs(const std::vector<ffi::Tensor>& inputs) const {
  if (inputs.size() != inputs_.size()) {
    throw Error("expected " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(inputs.size()));
  }
  std::map<std::string, int64_t> bound;      // symbol -> value, from the first input that has it
  std::map<std::string, std::string> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSig& s = inputs_[i];
    const ffi::Tensor& t = inputs[i];
    std::string label = "input " + std::to_string(i) + " (" + s.name + ": " + s.Describe() + ")";
    if (t.device().device_type != kDLCPU) throw Error(label + ": expected a CPU tensor");
    if (!t.IsContiguous()) throw Error(label + ": expected a contiguous (C order) tensor");
    if (DTypeName(t.dtype()) != s.dtype) throw Error(label + ": got dtype " + DTypeName(t.dtype()));
    if (t.ndim() != static_cast<int>(s.dims.size())) {
      throw Error(label + ": got " + std::to_string(t.ndim()) + " dims, shape " + ShapeText(t));
    }
    for (size_t k = 0; k < s.dims.size(); ++k) {
      int64_t got = t.shape()[k];
      if (s.dims[k] >= 0 && got != s.dims[k]) {
        throw Error(label + ": dim " + std::to_string(k) + " is " + std::to_string(got) + ", expected " +
                    std::to_string(s.dims[k]) + " (shape " + ShapeText(t) + ")");
      }
      if (s.dims[k] >= 0) continue;
      auto it = bound.find(s.syms[k]);
      if (it == bound.end()) {
        bound[s.syms[k]] = got;
        where[s.syms[k]] = s.name;
      } else if (it->second != got) {
        throw Error(label + ": dim " + s.syms[k] + " is " + std::to_string(got) + " here but " +
                    std::to_string(it->second) + " in " + where[s.syms[k]] + " (shape " + ShapeText(t) + ")");
      }
    }
  }
}

std::vector<ffi::Tensor> Model::Run(const std::vector<ffi::Tensor>& inputs) const {
  CheckInputs(inputs);
  std::unique_ptr<VM> vm;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      vm = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  if (!vm) vm = MakeVM();
  std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
  ffi::Any res;
  try {
    vm->main.CallPacked(args.data(), static_cast<int32_t>(args.size()), &res);
  } catch (const ffi::Error& e) {
    {
      std::lock_guard<std::mutex> lock(pool_mutex_);
      pool_.push_back(std::move(vm));
    }
    throw Error(std::string("the model failed: ") + e.kind() + ": " + e.message());
  }
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    pool_.push_back(std::move(vm));
  }
  // a copy of each output: the program may return a tensor the model holds (a constant, a loop's initial state)
  std::vector<ffi::Tensor> outs;
  try {                        // (a cast's ffi::Error said as this library's Error, as the header promises)
    for (const ffi::Any& item : res.cast<ffi::Array<ffi::Any>>()) {
      ffi::Tensor t = item.cast<ffi::Tensor>();
      ffi::Tensor copy = EmptyTensor(std::vector<int64_t>(t.shape().begin(), t.shape().end()), t.dtype());
      const char* data = static_cast<const char*>(t.data_ptr()) + t.byte_offset();
      std::memcpy(copy.data_ptr(), data, ffi::GetDataSize(*t.GetDLTensorPtr()));
      outs.push_back(copy);
    }
  } catch (const ffi::Error& e) {
    throw Error(std::string("the model's program did not return a tuple of tensors: ") + e.kind() + ": " +
                e.message());
  }
  return outs;
}

}  // namespace dyntvm
