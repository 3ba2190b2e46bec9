#!/bin/sh
# Build the C++ runner of dyntvm artifacts: one command, g++ (or $CXX) and TVM's runtime.
#
#   sh deploy/cpp/build.sh build/run_model
#
# TVM's runtime libraries (libtvm_runtime, libtvm_ffi) and tvm_ffi's headers come from the installed `apache-tvm` and `apache-tvm-ffi` wheels (found
# with $PYTHON, default python3), or from $TVM_PACKAGES (a folder holding the tvm/ and tvm_ffi/ packages, e.g. a
# `dyntvm bundle --cpp` folder, which this script finds by itself when it lies there).
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-run_model}
if [ -z "$TVM_PACKAGES" ] && [ -d "$here/../tvm_ffi/include" ]; then TVM_PACKAGES=$(cd "$here/.." && pwd); fi
if [ -z "$TVM_PACKAGES" ]; then
  TVM_PACKAGES=$(${PYTHON:-python3} -c \
    'import os, tvm_ffi; print(os.path.dirname(os.path.dirname(tvm_ffi.__file__)))') || {
    echo "build.sh: cannot find the apache-tvm-ffi wheel with ${PYTHON:-python3}; set \$PYTHON or \$TVM_PACKAGES" >&2
    exit 1
  }
fi
t=$TVM_PACKAGES
mkdir -p "$(dirname "$out")"
${CXX:-g++} -std=c++17 -O2 -pthread -I"$t/tvm_ffi/include" \
  "$here/dyntvm_deploy.cc" "$here/dyntvm_kernels.cc" "$here/run_model.cc" -o "$out" \
  -L"$t/tvm/lib" -L"$t/tvm_ffi/lib" -Wl,--no-as-needed -ltvm_runtime -ltvm_ffi -Wl,-rpath,"$t/tvm/lib" -Wl,-rpath,"$t/tvm_ffi/lib"
