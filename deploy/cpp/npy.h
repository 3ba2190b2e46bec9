// Minimal .npy reader / writer (format 1.0-3.0 read, 1.0 written): C-order little-endian arrays of
// float16/32/64, int8/16/32/64, uint8/16/32/64 and bool. No numpy needed.
#ifndef DYNTVM_NPY_H_
#define DYNTVM_NPY_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>

#include "dyntvm_deploy.h"

namespace dyntvm {
namespace npy {

inline std::string Descr(DLDataType t) {
  std::string name = DTypeName(t);
  if (name == "bool") return "|b1";
  if (t.bits == 8 && (t.code == kDLInt || t.code == kDLUInt)) return t.code == kDLInt ? "|i1" : "|u1";
  if (t.code != kDLFloat && t.code != kDLInt && t.code != kDLUInt) throw Error("no .npy dtype for " + name);
  return std::string("<") + (t.code == kDLFloat ? "f" : t.code == kDLInt ? "i" : "u") + std::to_string(t.bits / 8);
}

inline DLDataType FromDescr(const std::string& d, const std::string& path) {
  static const char* names[][2] = {{"<f4", "float32"}, {"<f8", "float64"}, {"<f2", "float16"}, {"<i8", "int64"},
                                   {"<i4", "int32"},   {"<i2", "int16"},   {"|i1", "int8"},    {"<u8", "uint64"},
                                   {"<u4", "uint32"},  {"<u2", "uint16"},  {"|u1", "uint8"},   {"|b1", "bool"}};
  for (auto& n : names) {
    if (d == n[0]) return ParseDType(n[1]);
  }
  throw Error(path + ": unsupported .npy dtype " + d +
              " (float16/32/64, int8/16/32/64, uint8/16/32/64, bool; little-endian)");
}

// Reads a C-order .npy file. Malformed files (a version other than 1-3, a header over 1 MB, a negative or
// overflowing shape, fewer data bytes than the shape needs) are errors, never a read past a buffer.
inline tvm::ffi::Tensor Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  f.seekg(0, std::ios::end);
  const std::streamoff file_size = f.tellg();
  f.seekg(0, std::ios::beg);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file");
  if (magic[6] < 1 || magic[6] > 3) throw Error(path + ": unsupported .npy format version " + std::to_string(magic[6]));
  uint32_t header_len = 0;
  unsigned char b[4] = {0, 0, 0, 0};
  if (magic[6] == 1) {
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  if (!f || header_len > (1u << 20)) throw Error(path + ": bad .npy header length");
  std::string header(header_len, '\0');
  if (!f.read(&header[0], header_len)) throw Error(path + ": truncated .npy header");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'"))) throw Error(path + ": no descr");
  DLDataType dtype = FromDescr(m[1], path);
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True"))) {
    throw Error(path + ": Fortran-order .npy files are not supported (save a C-order array)");
  }
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) throw Error(path + ": no shape");
  std::vector<int64_t> shape;
  std::string dims = m[1];
  if (!std::regex_match(dims, std::regex("\\s*(\\d{1,18}\\s*,\\s*)*(\\d{1,18}\\s*,?\\s*)?"))) {
    throw Error(path + ": bad .npy shape (" + dims + "): expected non-negative integers");
  }
  uint64_t bytes = (dtype.bits + 7) / 8;
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    shape.push_back(std::stoll(it->str()));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(shape.back()), &bytes)) {
      throw Error(path + ": .npy shape (" + dims + ") too large");
    }
  }
  if (static_cast<uint64_t>(file_size - f.tellg()) < bytes) throw Error(path + ": truncated .npy data");
  tvm::ffi::Tensor t = EmptyTensor(shape, dtype);
  if (bytes && !f.read(static_cast<char*>(t.data_ptr()), bytes)) throw Error(path + ": truncated .npy data");
  return t;
}

inline void Save(const std::string& path, const tvm::ffi::Tensor& t) {
  std::string shape;
  for (int k = 0; k < t.ndim(); ++k) {        // Python's tuple: (), (3,), (3, 4)
    shape += std::to_string(t.shape()[k]) + (t.ndim() == 1 ? "," : k + 1 < t.ndim() ? ", " : "");
  }
  std::string header = "{'descr': '" + Descr(t.dtype()) + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot write " + path);
  f.write("\x93NUMPY\x01\x00", 8);
  char len[2] = {static_cast<char>(header.size() & 255), static_cast<char>(header.size() >> 8)};
  f.write(len, 2);
  f.write(header.data(), header.size());
  f.write(static_cast<const char*>(t.data_ptr()), t.numel() * ((t.dtype().bits + 7) / 8));
  if (!f) throw Error("cannot write " + path);
}

}  // namespace npy
}  // namespace dyntvm

#endif  // DYNTVM_NPY_H_
