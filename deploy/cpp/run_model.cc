// Example: run a dyntvm artifact on .npy inputs, write its outputs as .npy files.
//
//   run_model ARTIFACT OUT_DIR [--threads N] [--repeat R] [--reload L] INPUT.npy...
//
// Inputs in the order of the model's signature. Writes OUT_DIR/output_K.npy (OUT_DIR made where missing).
// --threads N runs the model from N threads at once, R calls each, and checks every result is the same bytes.
// --reload L loads the artifact L more times, runs and drops each copy before the first model runs (a server
// replacing models), and prints how many C++ kernels are registered while the model lives and after it goes.
// Errors print one line `run_model: error: ...` and exit with status 1.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "dyntvm_deploy.h"
#include "npy.h"

namespace {

bool SameBytes(const tvm::ffi::Tensor& a, const tvm::ffi::Tensor& b) {
  if (a.ndim() != b.ndim() || dyntvm::DTypeName(a.dtype()) != dyntvm::DTypeName(b.dtype())) return false;
  for (int k = 0; k < a.ndim(); ++k) {
    if (a.shape()[k] != b.shape()[k]) return false;
  }
  return std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * ((a.dtype().bits + 7) / 8)) == 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> pos;
  int threads = 1, repeat = 1, reload = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--threads" || a == "--repeat") && i + 1 < argc) {
      (a == "--threads" ? threads : repeat) = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--reload" && i + 1 < argc) {
      reload = std::max(0, std::atoi(argv[++i]));
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() < 2) {
    std::cerr << "usage: run_model ARTIFACT OUT_DIR [--threads N] [--repeat R] [--reload L] INPUT.npy...\n";
    return 2;
  }
  auto model = dyntvm::Model::Load(pos[0]);
  std::vector<tvm::ffi::Tensor> inputs;
  for (size_t i = 2; i < pos.size(); ++i) inputs.push_back(dyntvm::npy::Load(pos[i]));
  for (int r = 0; r < reload; ++r) dyntvm::Model::Load(pos[0])->Run(inputs);
  std::vector<tvm::ffi::Tensor> outs = model->Run(inputs);
  if (threads > 1 || repeat > 1) {
    std::vector<std::thread> pool;
    std::vector<std::string> errors(threads);
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (int r = 0; r < repeat; ++r) {
            auto got = model->Run(inputs);
            for (size_t k = 0; k < outs.size(); ++k) {
              if (!SameBytes(got[k], outs[k])) throw dyntvm::Error("output " + std::to_string(k) + " differs");
            }
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < threads; ++t) {
      if (!errors[t].empty()) throw dyntvm::Error("thread " + std::to_string(t) + ": " + errors[t]);
    }
    std::cout << threads << " threads x " << repeat << " calls: same results\n";
  }
  std::error_code made;
  std::filesystem::create_directories(pos[1], made);     // (an error here: Save names the file it cannot write)
  for (size_t k = 0; k < outs.size(); ++k) dyntvm::npy::Save(pos[1] + "/output_" + std::to_string(k) + ".npy", outs[k]);
  std::cout << "wrote " << outs.size() << " outputs to " << pos[1] << "\n";
  if (reload >= 0) {
    std::cout << "kernels registered: " << dyntvm::detail::RegisteredKernels() << " with the model, ";
    model.reset();
    std::cout << dyntvm::detail::RegisteredKernels() << " after it\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "run_model: error: " << e.what() << "\n";
    return 1;
  }
}
