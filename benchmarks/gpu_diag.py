"""GPU diagnostics for benchmarks/gpu_host.sh: empty-input launches (one child each, CUDA_LAUNCH_BLOCKING=1), a kernel's CUDA
source, per-node profiles and cProfile of the LSTM and decode loops on CUDA, the LSTM step's kernels A/B (`lstm_ab`)
and the GRU decoder's with the same switches (`decoder_ab`; with `--cpu`: builds only, no GPU needed).
`python3 -P benchmarks/gpu_diag.py STAGE... [--cpu]`"""
import os, subprocess, sys, time
import numpy as np

CASES = {
    "sum_gt": "lambda x: F.sum(x, axis=1) > 0",
    "tanh": "lambda x: F.tanh(x) * 2.0",
    "mask_only": "lambda x: F.boolean_mask(x, F.sum(x, axis=1) > 0)",
    "nonzero": "lambda x: F.nonzero(F.sum(x, axis=1) > 0)",
    "mask_tanh": "lambda x: F.tanh(F.boolean_mask(x, F.sum(x, axis=1) > 0)) * 2.0",
}
CHILD = r'''
import sys, numpy as np, dyntvm as dt
from dyntvm import F
fn = eval(sys.argv[1]); n = int(sys.argv[2])
m = dt.compile(fn, dt.TensorSpec(("N", 4)), target="cuda", use_cache=False)
x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
try:
    got = m(x, profile=True)
    print("OK", [np.asarray(g).shape for g in (got if isinstance(got, tuple) else (got,))], m.last_copies)
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:300])
    import tvm
    from dyntvm.codegen.build import collect_regions
    print([k for k in m.graph.nodes][:20] if hasattr(m.graph, "nodes") else "")
'''
def empties():
    for name, src in CASES.items():
        for n in (0, 1, 3):
            env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
            r = subprocess.run([sys.executable, "-c", CHILD, src, str(n)], capture_output=True, text=True, env=env,
                               timeout=120, cwd="/tmp")
            out = (r.stdout.strip().splitlines() or [""])[-2:]
            err = (r.stderr.strip().splitlines() or [""])[-1:]
            print(f"{name:10s} n={n} rc={r.returncode} {out} {err if r.returncode else ''}", flush=True)

def kernel_source():
    import dyntvm as dt
    global F
    from dyntvm import F
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.codegen.backends.cuda import gpu
    from dyntvm.pipeline import partition_graph
    regions = collect_regions(partition_graph(dt.trace(eval(CASES[os.environ.get("KCASE", "sum_gt")]), dt.TensorSpec(("N", 4)))))
    mod = build_module(regions, device_checks=True)
    ex = gpu.build_cuda(mod)
    def walk(m, d=0):
        print("  " * d, m.kind if hasattr(m, "kind") else type(m).__name__)
        if getattr(m, "kind", "") == "cuda":
            try:
                print(m.inspect_source()[:6000])
            except Exception as e:
                print("no source", e)
        for i in m.imports:
            walk(i, d + 1)
    walk(ex.mod)

def _profile(label, m, args, calls):
    """Mean time of `calls` calls, then one profiled call: its slowest nodes."""
    for _ in range(3):
        m(*args)
    t0 = time.perf_counter()
    for _ in range(calls):
        m(*args)
    per = (time.perf_counter() - t0) / calls
    m(*args, profile=True)
    print(f"== {label}: {per * 1e3:.3f} ms/call; copies {m.last_copies}")
    for k, (c, s) in sorted(m.last_profile.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"   {k:40s} calls {c:5d} total {s*1e3:8.3f} ms  per call {s/c*1e6:8.1f} us")


def profiles():
    import dyntvm as dt
    sys.path.insert(0, "benchmarks")
    from dyntvm import examples
    from peers import BuildContext, decode
    ex = examples.get("lstm")
    inputs = ex.make_inputs(np.random.default_rng(0), T=64, B=1)
    for target in ("cuda", "cpu"):
        _profile(f"lstm T64 B1 {target}", dt.compile(ex.fn, *ex.specs, target=target), inputs, 20)
    p = decode.workload().builders["dyntvm"](BuildContext(device="cuda"))
    _profile("decode cuda", p.keep, p.args, 10)


def cprof():
    import cProfile, pstats, dyntvm as dt
    sys.path.insert(0, "benchmarks")
    from dyntvm import examples
    from peers import decode, BuildContext
    ex = examples.get("lstm")
    m = dt.compile(ex.fn, *ex.specs, target="cuda")
    inputs = ex.make_inputs(np.random.default_rng(0), T=64, B=1)
    m(*inputs)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(5):
        m(*inputs)
    pr.disable()
    print("== cProfile lstm cuda x5"); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
    p = decode.workload().builders["dyntvm"](BuildContext(device="cuda"))
    p.fn(*p.args)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(5):
        p.fn(*p.args)
    pr.disable()
    print("== cProfile decode cuda x5"); pstats.Stats(pr).sort_stats("tottime").print_stats(14)

def kernel_times():
    """Device time per CUDA kernel (torch.profiler over CUPTI sees TVM's kernels too) for the loop workloads and a
    small model: which kernels a step spends its time in."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    import dyntvm as dt
    sys.path.insert(0, "benchmarks")
    from dyntvm import examples
    from peers import BuildContext, decode
    work = []
    p = decode.workload().builders["dyntvm"](BuildContext(device="cuda"))
    work.append(("greedy decode (56 steps)", p.fn, p.args))
    for name, sizes in (("lstm", dict(T=64, B=1)), ("lstm", dict(T=64, B=16)), ("branchy", dict(B=1)),
                        ("detection", dict(N=200)), ("transformer", dict(B=16, S=128))):
        ex = examples.get(name)
        m = dt.compile(ex.fn, *ex.specs, target="cuda")
        work.append((f"{name} {sizes}", m, ex.make_inputs(np.random.default_rng(0), **sizes)))
    for label, fn, args in work:
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fn(*args)
            torch.cuda.synchronize()
        print(f"== {label}: 5 calls")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=60))


def launches():
    """Host cost of a kernel launch, three ways: torch (a tiny add, 2000 times), one dyntvm region call of a
    one-kernel region (2000 calls), and a dyntvm device loop (a foreach over 2000 rows whose body has 1 or 4
    kernels: the difference per step / 3 is the loop's cost per launched kernel)."""
    import torch
    import dyntvm as dt
    from dyntvm import F

    def per(fn, n):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6
    x = torch.zeros(16, device="cuda")

    def adds():
        for _ in range(2000):
            x.add_(1.0)
    print(f"torch add_: {per(adds, 2000):.2f} us per launch", flush=True)
    m = dt.compile(lambda v: v * 2.0 + 1.0, dt.TensorSpec(("N",)), target="cuda", use_cache=False)
    v = np.ones(16, np.float32)
    m(v)
    print(f"dyntvm region call (numpy in/out, 1 kernel): {per(lambda: [m(v) for _ in range(2000)], 2000):.2f} us per call",
          flush=True)

    def body1(row, states):
        acc = states[0] * 0.5 + row
        return acc, [acc]

    def body4(row, states):
        a = F.tanh(states[0] * 0.5 + row)
        b = F.sum(a) * a                 # a reduction between elementwise ops: separate kernels
        c = F.max(b) + b
        acc = F.sum(c) * 0.001 + c
        return acc, [acc]
    xs = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    for label, body in (("1 kernel", body1), ("4+ kernels", body4)):
        mm = dt.compile(lambda s, b=body: F.foreach(b, s, [F.zeros((16,))])[0], dt.TensorSpec(("T", 16)),
                        target="cuda", use_cache=False)
        mm(xs)
        print(f"dyntvm device loop, body {label}: {per(lambda: mm(xs), 2000):.2f} us per step", flush=True)


LSTM_SIZES = ((1, 64), (16, 64), (1, 256))           # (B, T): bench_peers' LSTM rows
#: variant -> (gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV)
LSTM_VARIANTS = {"new": (True, True), "merge only": (True, False), "old": (False, False)}


def _lstm_switches(merge, small_m):
    from dyntvm.codegen.backends.cuda import gpu_fuse, gpu_gemv
    gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV = merge, small_m


def _lstm_body_kernels() -> dict:
    """variant -> the device loop body's kernels, from a CUDA build in this process (CUDA source without a GPU)."""
    import re
    import dyntvm as dt
    from dyntvm.codegen.backends.cuda import gpu
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.compiled_loops import loop_specs
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.examples import lstm as ex
    from dyntvm.pipeline import partition_graph
    out = {}
    for name, flags in LSTM_VARIANTS.items():
        _lstm_switches(*flags)
        graph = partition_graph(dt.trace(ex.lstm, *ex.EXAMPLE.specs))
        built = gpu.build_cuda(build_module(collect_regions(graph), device_checks=True), gpu.cuda_target("sm_90"),
                               None, loop_specs(graph, "cuda"))

        def sources(m):
            try:
                text = m.inspect_source()
            except Exception:  # noqa: BLE001 - a module without source (device code)
                text = ""
            return text + "".join(sources(i) for i in m.imports)
        kernels = re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", sources(built.mod))
        out[name] = sorted({k for k in kernels if "__loop__" in k})
    return out


def _variants(fn, specs, dry: bool) -> dict:
    """variant of LSTM_VARIANTS -> `fn` compiled for CUDA with those switches (for sm_90 without a GPU: `dry`)."""
    import dyntvm as dt
    models = {}
    for name, flags in LSTM_VARIANTS.items():
        _lstm_switches(*flags)
        t0 = time.perf_counter()
        models[name] = dt.compile(fn, *specs, target="cuda:sm_90" if dry else "cuda", use_cache=False)
        print(f"built {name!r} (merge {flags[0]}, small-M {flags[1]}) in {time.perf_counter() - t0:.1f} s",
              flush=True)
    return models


def lstm_ab():
    """The LSTM of bench_peers (B1 T64, B16 T64, B1 T256) compiled for CUDA with the step's new kernels
    (`gpu_fuse.MERGE_ELEMENTWISE`: gates + cell + h in one kernel; `gpu_gemv.SMALL_M_GEMV`: the step's matmul as
    a small-M GEMV) on and off, in one process: each variant checked against numpy, then timed interleaved
    (median ms per call, numpy in and out, as bench_peers) with torch's nn.LSTM (cuDNN) in the same rounds; then
    the step kernels' device time (torch.profiler). `--cpu` (no GPU): builds each variant for CUDA (device code
    from nvcc in the stub child) and lists the loop body's kernels; nothing runs. `--no-log`: without the
    shipped tuning log, which specializes the step for B = 1 (a static M = 1: dlight's schedule) and B = 16 (a tuned
    matmul), so that the small-M schedule runs at every B; by default the models are built as bench_peers
    builds them (with the log), where only the merged elementwise kernel differs at B1 / B16."""
    from dyntvm.codegen.backends.cuda import gpu_fuse, gpu_gemv
    from dyntvm.examples import lstm as ex
    from dyntvm.examples.plain_numpy import numpy_lstm
    saved = gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV
    dry = "--cpu" in sys.argv
    t_start = time.perf_counter()
    if "--no-log" in sys.argv:     # no shipped tuning log: B stays symbolic (the log specializes B = 1 and 16)
        import tempfile
        os.environ["DYNTVM_TUNING_LOGS"] = tempfile.mkdtemp(prefix="no-logs-")
        print("lstm_ab: without the shipped tuning logs", flush=True)
    try:
        models = _variants(ex.lstm, ex.EXAMPLE.specs, dry)
        if dry:
            for name, kernels in _lstm_body_kernels().items():
                print(f"{name}: loop body kernels per step: {len(kernels)}: {', '.join(kernels)}")
            return
        _lstm_ab_time(models, numpy_lstm, ex)
    finally:
        _lstm_switches(*saved)
        print(f"lstm_ab: {time.perf_counter() - t_start:.1f} s", flush=True)


def _lstm_ab_time(models, numpy_lstm, ex, rounds=30):
    import torch
    from torch.profiler import ProfilerActivity, profile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import BuildContext
    from peers.common import torch_builder
    from peers.lstm import torch_nn_lstm
    rows = []
    for B, T in LSTM_SIZES:
        inputs = ex.make_inputs(np.random.default_rng(0), T=T, B=B)
        want = numpy_lstm(*inputs)
        runs = {name: (lambda m=m: m(*inputs)) for name, m in models.items()}
        cudnn = torch_builder(torch_nn_lstm, inputs)(BuildContext(device="cuda"))
        runs["nn.LSTM (cuDNN)"] = lambda p=cudnn: p.fn(*p.args)
        for name, run in runs.items():
            got = run()
            got = [g.detach().cpu().numpy() if hasattr(g, "detach") else np.asarray(g) for g in got]
            ok = all(np.allclose(g, w, rtol=1e-3, atol=1e-4) for g, w in zip(got, want))
            print(f"B{B} T{T} {name}: matches numpy: {ok}", flush=True)
            for _ in range(3):
                run()
        times = {name: [] for name in runs}
        names = list(runs)
        for r in range(rounds):                    # interleaved, the order rotated each round
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
        med = {name: 1e3 * float(np.median(v)) for name, v in times.items()}
        rows.append((f"LSTM B{B} T{T}", med))
        print(f"B{B} T{T}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()), flush=True)
    names = list(rows[0][1])
    print("\n| workload | " + " | ".join(f"{n} ms" for n in names) + " | new / old | new / cuDNN |")
    print("|---|" + "---:|" * (len(names) + 2))
    for label, med in rows:
        print(f"| {label} | " + " | ".join(f"{med[n]:.3f}" for n in names)
              + f" | {med['new'] / med['old']:.2f} | {med['new'] / med['nn.LSTM (cuDNN)']:.2f} |")
    B, T = LSTM_SIZES[0]
    inputs = ex.make_inputs(np.random.default_rng(0), T=T, B=B)
    for name in ("new", "old"):
        m = models[name]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                m(*inputs)
            torch.cuda.synchronize()
        print(f"== kernel times, {name}, B{B} T{T}, 3 calls ({3 * T} steps)")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=8, max_name_column_width=70))


def decoder_ab():
    """The GRU decoder of bench_peers (P3, 32 steps), whose CUDA time rose 1.75 -> 3.75 ms between the H100 and H200
    runs while its step started taking the merged elementwise kernel and the small-M GEMV: built with each
    LSTM_VARIANTS setting of those switches, checked against numpy, timed interleaved (median ms per call, 30
    rounds, the order rotated), then the kernels' device time of the new and the old variant (torch.profiler).
    `--cpu`: builds each variant for sm_90 (nvcc in the stub child) and runs nothing."""
    from dyntvm.codegen.backends.cuda import gpu_fuse, gpu_gemv
    from dyntvm.examples import decoder as ex
    from dyntvm.examples.plain_numpy import numpy_decoder
    saved = gpu_fuse.MERGE_ELEMENTWISE, gpu_gemv.SMALL_M_GEMV
    dry = "--cpu" in sys.argv
    inputs = ex.make_inputs(np.random.default_rng(0), P=3, max_steps=32)
    want = numpy_decoder(*inputs)
    try:
        models = _variants(ex.decoder, ex.EXAMPLE.specs, dry)
        if dry:
            return
        runs = {name: (lambda m=m: m(*inputs)) for name, m in models.items()}
        for name, run in runs.items():
            got = run()
            ok = np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
            print(f"decoder {name}: matches numpy: {ok}", flush=True)
        times = {name: [] for name in runs}
        names = list(runs)
        for r in range(30):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
        print("decoder P3: " + ", ".join(f"{k} {1e3 * float(np.median(v)):.3f} ms" for k, v in times.items()),
              flush=True)
        import torch
        from torch.profiler import ProfilerActivity, profile
        for name in ("new", "old"):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    models[name](*inputs)
                torch.cuda.synchronize()
            print(f"== kernel times, decoder {name}, 3 calls")
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=10, max_name_column_width=70))
    finally:
        _lstm_switches(*saved)


for stage in [a for a in sys.argv[1:] if not a.startswith("--")]:
    print("#####", stage, flush=True)
    try:
        globals()[stage]()
    except Exception:
        import traceback
        traceback.print_exc()
