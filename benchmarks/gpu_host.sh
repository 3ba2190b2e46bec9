#!/bin/bash
# Run dyntvm's GPU tests and the GPU peer benchmark on a CUDA host that has Python, numpy, torch and nvcc but
# no TVM (how the H100 results in benchmarks/README.md were made). Usage, from the repository root there:
#
#     TEST_LIMIT=200 BENCH_LIMIT=240 bash benchmarks/gpu_host.sh cudatests bench
#
# It installs, into /tmp/site, what was prepared on the build machine (paths ignored by git):
#   .whl/          apache-tvm-ffi==0.1.14.post1 for the host's Python (a cp312 wheel there) and platformdirs:
#                  pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ...
#                  (to fit the 64 MiB a call carries, the ffi wheel may travel unpacked, less its 3rdparty/, as
#                  .whl/*.tar.xz, unpacked into /tmp/site as it is; keep lib/libtvm_ffi_testing.so: tvm_ffi.core
#                  links it)
#   .gpu/cuda_logs.tar.xz        tuning_logs/*/cuda-*/ when tuning_logs/ is moved aside for the call (its CPU
#                                logs do not fit): unpacked into tuning_logs/ first
#   .gpu/tvm-py.tar.xz           site-packages/tvm without 3rdparty/, src/, web/, include/ and
#                                lib/libtvm_compiler.so (2.7 MB)
#   .gpu/libtvm_compiler.so.xz   xz --x86 --lzma2=preset=9e,dict=256MiB of the compiler library (58 MB: the
#                                whole carry fits in 64 MiB with tuning_logs/ moved aside for that one call)
#   .whl2/         xgboost-cpu (MetaSchedule's cost model; stages tunetests, tune): it does not fit in the same
#                  call as .gpu, so a second call on the still-warm machine carries it (installed into /tmp/site2)
# then dyntvm itself (`pip install --target`), and runs the stages named on the command line:
#   cudatests  tests/test_cuda.py, test_cuda_loops.py, test_gpu_reduction.py, test_gpu_lstm.py, test_device_buffers.py,
#              test_artifact.py, test_deploy.py (from a copy of the tests: a `python -c` child started in the repository
#              root would import the source folder dyntvm/
#              instead)
#   bench      benchmarks/bench_peers.py --gpu (numpy, torch, nn.LSTM and dyntvm on the CPU; PyTorch CUDA,
#              nn.LSTM CUDA and dyntvm CUDA); results in $OUT
#   calls      benchmarks/gpu_calls.py: small models' calls with the device buffer pool on / off, and a cProfile of
#              one call; $OUT/calls.log
#   loops      benchmarks/gpu_loops.py: the loop workloads with and without device loops (region calls, copies,
#              ms per call); $OUT/loops.log
# On the GPU host: install the carried TVM (compiler included) + dyntvm into /tmp/site, then run stages.
export PYTHONUNBUFFERED=1
[ -f .gpu/cuda_logs.tar.xz ] && [ ! -d tuning_logs ] && tar xJf .gpu/cuda_logs.tar.xz
export OUT=${OUT:-/tmp/gpu-out}; mkdir -p $OUT
S=/tmp/site
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
if [ ! -f $S/.ready ]; then
  stamp setup
  mkdir -p $S
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S .whl/*.whl || exit 1
  for t in .whl/*.tar.xz; do [ -f "$t" ] && { tar xJf "$t" -C $S || exit 1; }; done
  tar xJf .gpu/tvm-py.tar.xz -C $S || exit 1
  xz -T0 -dc .gpu/libtvm_compiler.so.xz > $S/tvm/lib/libtvm_compiler.so || exit 1
  touch $S/.ready
fi
rm -rf $S/dyntvm $S/dyntvm-*.dist-info
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target $S . >/dev/null 2>&1 || \
  python3 -m pip install --no-index --no-deps --no-build-isolation --no-compile --target $S . || exit 1
export PYTHONPATH=$S
if ls .whl2/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site2/.ready ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 .whl2/*.whl && \
    touch /tmp/site2/.ready || exit 1
fi
[ -d /tmp/site2 ] && export PYTHONPATH=$S:/tmp/site2
CUDART=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)
[ -n "$CUDART" ] && export LD_LIBRARY_PATH=$(dirname $CUDART)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:$PATH
stamp "env ready; cudart=$CUDART"
for stage in "$@"; do
  stamp "stage $stage"
  case $stage in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; python3 -V
      python3 -P -c "import numpy, tvm, dyntvm; from dyntvm.codegen.backends.cuda.gpu import gpu_present, cuda_target; print('numpy', numpy.__version__, 'tvm', tvm.__file__, 'gpu', gpu_present(), cuda_target())" ;;
    cudatests)
      # from a copy without the source folder dyntvm/: `python -c` / `-m` children put the cwd first on sys.path
      rm -rf /tmp/w && mkdir -p /tmp/w && cp -r tests benchmarks examples pyproject.toml README.md /tmp/w/ && cd /tmp/w && \
      timeout ${TEST_LIMIT:-300} python3 -P -m pytest -p no:cacheprovider -p no:benchmark -q -n 8 tests/test_cuda.py tests/test_cuda_loops.py tests/test_gpu_reduction.py tests/test_gpu_lstm.py tests/test_device_buffers.py tests/test_artifact.py tests/test_deploy.py \
        --junitxml=$OUT/junit_cuda.xml 2>&1 | tee $OUT/cudatests.log | tail -60; cd - >/dev/null ;;
    tunetests)
      rm -rf /tmp/w && mkdir -p /tmp/w && cp -r tests benchmarks examples pyproject.toml README.md /tmp/w/ && cd /tmp/w && \
      timeout ${TEST_LIMIT:-300} python3 -P -m pytest -p no:cacheprovider -p no:benchmark -q tests/test_tuning_cuda.py \
        2>&1 | tee $OUT/tunetests.log | tail -30; cd - >/dev/null ;;
    tune)
      # CUDA logs of the examples (resumable), then each example with / without its log; logs come back in $OUT
      mkdir -p /tmp/tw/tuning_logs && cp -r benchmarks examples pyproject.toml /tmp/tw/ && cd /tmp/tw && \
      timeout ${TUNE_LIMIT:-400} python3 -P benchmarks/tune_examples.py --target cuda --trials ${TRIALS:-32} \
        --only ${ONLY:-transformer,lstm,detection} ${TUNE_ARGS} 2>&1 | tee -a $OUT/tune.log | grep -v "^\s*$" | tail -60
      tar czf $OUT/cuda_logs.tgz $(ls -d tuning_logs/*/cuda-*/manifest.json tuning_logs/*/cuda-*/database_*.json); cd - >/dev/null ;;
    loops)
      timeout ${LOOPS_LIMIT:-240} python3 -P benchmarks/gpu_loops.py ${LOOP_CALLS:-50} 2>&1 | tee $OUT/loops.log | tail -40 ;;
    calls)
      timeout ${CALLS_LIMIT:-120} python3 -P benchmarks/gpu_calls.py ${CALL_ROUNDS:-5} 2>&1 | tee $OUT/calls.log | tail -45 ;;
    diag)
      timeout ${DIAG_LIMIT:-300} python3 -P benchmarks/gpu_diag.py ${DIAG:-empties kernel_source profiles} 2>&1 | tee $OUT/diag.log | tail -120 ;;
    alltests)
      timeout ${TEST_LIMIT:-300} python3 -P -m pytest -p no:cacheprovider -p no:benchmark -q -n 14 --dist loadfile tests \
        --junitxml=$OUT/junit_all.xml 2>&1 | tee $OUT/alltests.log | tail -40 ;;
    bench)
      timeout ${BENCH_LIMIT:-300} python3 benchmarks/bench_peers.py --gpu --no-isolate --rounds ${ROUNDS:-3} \
        --systems ${SYSTEMS:-numpy,torch,torch_lstm,dyntvm,torch_cuda,torch_lstm_cuda,dyntvm_cuda} --out $OUT ${BENCH_ARGS} 2>&1 | tee $OUT/bench.log | tail -45 ;;
    *) eval "$stage" ;;
  esac
done
stamp done
