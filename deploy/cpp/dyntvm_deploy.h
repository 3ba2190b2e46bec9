// dyntvm C++ deployment: load a dyntvm artifact (`dyntvm compile ... -o model.dtvm`) and run it with TVM's
// runtime alone (libtvm_runtime.so, libtvm_ffi.so), no Python.
//
// A model runs as its VM program (`dyntvm_main` in kernels.so: the whole partitioned graph as one Relax VM
// function). The dynamic-shape ops the program calls back for (`dyntvm.vm_kernel`) run as the C++ kernels of
// dyntvm_kernels.cc; a model needing an op without one, or whose library has no VM program, is refused by
// `Model::Load` with an error naming what is missing. See deploy/cpp/README.md.
#ifndef DYNTVM_DEPLOY_H_
#define DYNTVM_DEPLOY_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

namespace dyntvm {

// Every error of this library: bad artifact, inputs that do not fit the signature, a failing run-time check.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// One input or output of the model's signature: dims are ints or symbol names ("N"); -1 + name for a symbol.
struct TensorSig {
  std::string name;
  std::vector<int64_t> dims;        // -1 where the dim is symbolic
  std::vector<std::string> syms;    // the symbol's name where dims[k] == -1
  std::string dtype;                // "float32", "int64", "bool", ...
  std::string Describe() const;
};

class Model {
 public:
  // Load the artifact folder `path` (manifest.json, graph.json, kernels.so). Throws dyntvm::Error.
  static std::shared_ptr<Model> Load(const std::string& path);

  // Run the model on CPU tensors in the order of `inputs()`. Thread-safe: each concurrent call runs on a VM
  // of its own. Outputs are fresh tensors (never shared with the model). Throws dyntvm::Error.
  std::vector<tvm::ffi::Tensor> Run(const std::vector<tvm::ffi::Tensor>& inputs) const;

  const std::vector<TensorSig>& inputs() const { return inputs_; }
  const std::vector<TensorSig>& outputs() const { return outputs_; }

  // Releases the model's entries of the C++ kernel table (those no other loaded model shares).
  ~Model();

 private:
  struct VM {
    tvm::ffi::Module exec;
    tvm::ffi::Function main;
  };
  std::unique_ptr<VM> MakeVM() const;
  void CheckInputs(const std::vector<tvm::ffi::Tensor>& inputs) const;

  std::string path_;
  std::optional<tvm::ffi::Module> lib_;     // set by Load
  std::vector<TensorSig> inputs_, outputs_;
  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<VM>> pool_;   // idle VMs (a VM runs one call at a time)
  std::vector<std::string> kernel_keys_;             // its kernel table entries, released by ~Model
};

// Allocate an uninitialized CPU tensor.
tvm::ffi::Tensor EmptyTensor(const std::vector<int64_t>& shape, DLDataType dtype);
// "float32" <-> DLDataType
DLDataType ParseDType(const std::string& name);
std::string DTypeName(DLDataType t);

namespace detail {
// Registers the callbacks the VM program calls (dyntvm.vm_kernel, dyntvm.vm_size_guard, dyntvm.vm_fallback).
void RegisterCallbacks();
// The kernels of one model's dynamic-shape nodes, by the key the program passes ("<binding>:<index>").
// `graph_json` is graph.json's text; `required`, the indices the program calls back on every run (its library's
// dyntvm_callbacks; null for a library without it: all); throws dyntvm::Error naming every required op without a
// C++ kernel (the others, kernels of the program itself, are called back only to raise a failing check's error:
// without a C++ kernel that error names the node key instead). Returns the keys,
// counted once more each (two loads of one artifact share them), for ReleaseModelKernels when the model goes:
// a server loading model after model keeps only the live models' kernels.
std::vector<std::string> RegisterModelKernels(const std::string& prefix, const std::string& graph_json,
                                              const std::set<int64_t>* required);
void ReleaseModelKernels(const std::vector<std::string>& keys);
// How many node keys the table holds (all live models together).
size_t RegisteredKernels();
}  // namespace detail

}  // namespace dyntvm

#endif  // DYNTVM_DEPLOY_H_
