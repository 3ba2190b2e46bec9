"""Gradients: the LSTM's compiled forward + backward against torch `nn.LSTM`, and the memory / time of the two
loop-memory strategies on a long `while_loop`.

    .venv/bin/python benchmarks/bench_grad.py [--batch 16] [--steps 64] [--rounds 5] [--repeat 5]
                                              [--loop-steps 10000] [--only lstm|loop] [--threads 2] [--tree DIR]

(`--tree DIR`: dyntvm from another source tree, e.g. ``git archive REV | tar -x -C DIR``: a before/after run,
each against torch in its own process.)

1. LSTM (`examples/lstm.py`: input 128, hidden 256, its weights), a batch of B sequences of T steps, loss
   ``sum(hs ** 2)``; the gradient with respect to W, U, b and xs. dyntvm: ``dt.compile(dt.value_and_grad(loss,
   argnums=(0, 1, 2, 3), memory=...))`` for both `memory` strategies; torch: `nn.LSTM` with the same weights,
   forward + ``loss.backward()``. The gradients are checked against torch's first (allclose), then the three
   are timed interleaved in this process (`--rounds` rounds, each a median over `--repeat` calls, after a
   short pause so the previous runtime's worker threads go idle); reported: the median over rounds and the
   best round, and dyntvm / torch (goal <= 1.0).
2. A `while_loop` of `--loop-steps` iterations (a data-dependent trip count: ``i < n``, n an input) over a
   carry of 1024 float32 (4 KB) with a few elementwise intermediates per step; loss ``sum(x ** 2)``. Peak
   memory of one call, per strategy and for the forward alone, each in a fresh subprocess: the kernel's peak
   RSS (VmHWM, reset through /proc/self/clear_refs after the build, which is a cache hit) minus the RSS
   before the call (`tracemalloc` does not see TVM's tensors). The time per call is measured interleaved in
   this process. The forward's own peak is the baseline: what a strategy adds is its stack.
Prints the load average at the start and the end: another process on the machine moves the wall times. The
CPU time of this process is printed too: with `--threads 1` (no pool spinning) it is the steadier figure on a
loaded machine.
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from thread_env import threads_from_argv
    threads_from_argv(sys.argv, 2)
    if "--tree" in sys.argv:            # dyntvm from another source tree (a before/after run), not the venv's
        import tempfile
        from bench_ab import package_root
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, package_root(sys.argv[sys.argv.index("--tree") + 1], tempfile.mkdtemp(prefix="dt-")))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import dyntvm as dt  # noqa: E402
from dyntvm import F  # noqa: E402
from dyntvm.examples import lstm as ex  # noqa: E402

MEMORY = ("recompute", "save_all")
S = dt.TensorSpec


# ------------------------------------------------------------------------------------------ 1. LSTM
def lstm_loss(W, U, b, xs, h0, c0):
    hs, _ = F.foreach(lambda x, states: ex.cell(x, states, W, U, b), xs, [h0, c0])
    return F.sum(hs * hs)


def compile_lstm_grad(memory):
    I, H = ex.INPUT, ex.HIDDEN
    return dt.compile(dt.value_and_grad(lstm_loss, argnums=(0, 1, 2, 3), memory=memory),
                      S((I, 4 * H)), S((H, 4 * H)), S((4 * H,)), S(("T", "B", I)), S(("B", H)), S(("B", H)))


def torch_lstm_step(xs, h0, c0):
    """nn.LSTM with the example's weights (torch: [4H, in] matrices, gate order i, f, g, o as ours); returns a
    function running forward + backward and returning (loss, dW, dU, db, dxs) as numpy."""
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    lstm = torch.nn.LSTM(ex.INPUT, ex.HIDDEN)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(ex.W.T))
        lstm.weight_hh_l0.copy_(torch.from_numpy(ex.U.T))
        lstm.bias_ih_l0.copy_(torch.from_numpy(ex.b))
        lstm.bias_hh_l0.zero_()
    tx, th, tc = torch.from_numpy(xs).requires_grad_(True), torch.from_numpy(h0)[None], torch.from_numpy(c0)[None]

    def step():
        lstm.zero_grad()
        tx.grad = None
        hs, _ = lstm(tx, (th, tc))
        loss = (hs * hs).sum()
        loss.backward()
        return loss

    def grads():
        loss = step()
        return (loss.item(), lstm.weight_ih_l0.grad.T.numpy(), lstm.weight_hh_l0.grad.T.numpy(),
                lstm.bias_ih_l0.grad.numpy(), tx.grad.numpy())
    return step, grads


def block_median(fn, args, repeat):
    """(median wall time, median CPU time of this process, least CPU time) of `repeat` calls."""
    fn(*args)
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(*args)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), min(cpu)


def interleaved(systems: dict, rounds: int, repeat: int, pause: float = 0.2) -> dict:
    """name -> list of per-round medians; the order rotates between rounds."""
    names = list(systems)
    res = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(pause)
            fn, args = systems[k]
            res[k].append(block_median(fn, args, repeat))
    return res


def report(res: dict, ref: str) -> None:
    """Wall time (median over rounds, best round) and CPU time (median over rounds; the least of all calls: on a
    loaded machine the steadiest figure, other processes only add to a call's time), each against `ref`'s."""
    def stats(ts):
        wall, cpu = [t[0] for t in ts], [t[1] for t in ts]
        return statistics.median(wall), min(wall), statistics.median(cpu), min(t[2] for t in ts)
    r_med, r_best, r_cpu, r_least = stats(res[ref])
    for k, ts in res.items():
        med, best, cpu, least = stats(ts)
        print(f"  {k:<22} wall median {med * 1e3:8.1f} ms, best {best * 1e3:8.1f} ms; cpu {cpu * 1e3:8.1f} ms, "
              f"least {least * 1e3:6.1f} ms   / {ref}: {med / r_med:5.2f} (best {best / r_best:5.2f}, "
              f"cpu {cpu / r_cpu:5.2f}, least {least / r_least:5.2f})")


def bench_lstm(args):
    rng = np.random.default_rng(0)
    B, T = args.batch, args.steps
    xs = rng.standard_normal((T, B, ex.INPUT)).astype(np.float32)
    h0 = (rng.standard_normal((B, ex.HIDDEN)) * 0.1).astype(np.float32)
    c0 = (rng.standard_normal((B, ex.HIDDEN)) * 0.1).astype(np.float32)
    inputs = (ex.W, ex.U, ex.b, xs, h0, c0)
    torch_step, torch_grads = torch_lstm_step(xs, h0, c0)
    want = torch_grads()
    systems = {}
    for memory in MEMORY:
        t0 = time.perf_counter()
        model = compile_lstm_grad(memory)
        build = time.perf_counter() - t0
        value, grads = model(*inputs)
        for name, got, ref in zip(("loss", "dW", "dU", "db", "dxs"), (value,) + tuple(grads), want):
            np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max(),
                                       err_msg=f"LSTM gradient ({memory}): {name} differs from torch")
        print(f"LSTM B{B} T{T}, memory={memory}: gradients match torch (build {build:.1f} s)")
        systems[f"dyntvm {memory}"] = (model, inputs)
    systems["torch nn.LSTM"] = (torch_step, ())
    res = interleaved(systems, args.rounds, args.repeat)
    print(f"LSTM (input {ex.INPUT}, hidden {ex.HIDDEN}) B{B} T{T}, forward + backward, {args.rounds} rounds x "
          f"{args.repeat} calls:")
    report(res, "torch nn.LSTM")


# ------------------------------------------------------------------------------------ 2. long loop
LOOP_WIDTH = 1024


def loop_loss(x, w, n):
    """`n` steps of x <- (tanh(sin(x) * w + x) + x) / 2: four elementwise intermediates of x's size a step."""
    def body(i, x):
        y = F.sin(x) * w
        z = F.tanh(y + x)
        return [i + 1, (z + x) * 0.5]
    _, x = F.while_loop(lambda i, x: i < n, body, [np.int64(0), x])
    return F.sum(x * x)


def compile_loop(kind):
    specs = (S((LOOP_WIDTH,)), S((LOOP_WIDTH,)), S((), "int64"))
    fn = loop_loss if kind == "forward" else dt.value_and_grad(loop_loss, argnums=(0, 1), memory=kind)
    return dt.compile(fn, *specs)


def loop_inputs(steps):
    rng = np.random.default_rng(1)
    return (rng.standard_normal(LOOP_WIDTH).astype(np.float32), (rng.random(LOOP_WIDTH) * 0.5).astype(np.float32),
            np.int64(steps))


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def loop_memory_child(kind, steps):
    """In a fresh process: build (a cache hit), reset the peak RSS, one call; prints the peak it added."""
    model = compile_loop(kind)
    inputs = loop_inputs(steps)
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                     # resets VmHWM to the current RSS
    before = _status_kb("VmRSS")
    model(*inputs)
    peak = _status_kb("VmHWM")
    print(json.dumps({"kind": kind, "before_kb": before, "peak_kb": peak, "added_kb": peak - before}))


def bench_loop(args):
    steps = args.loop_steps
    inputs = loop_inputs(steps)
    models = {k: compile_loop(k) for k in ("forward",) + MEMORY}      # warms the cache for the children
    (v_r, g_r), (v_s, g_s) = models["recompute"](*inputs), models["save_all"](*inputs)
    assert np.allclose(v_r, v_s) and np.allclose(float(models["forward"](*inputs)), v_r)
    for a, b in zip(g_r, g_s):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    mem = {}
    for kind in models:
        tree = ["--tree", args.tree] if args.tree else []
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--loop-child", kind,
                              "--loop-steps", str(steps), "--threads", str(args.threads)] + tree,
                             capture_output=True, text=True, check=True)
        mem[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    res = interleaved({k: (m, inputs) for k, m in models.items()}, args.rounds, max(1, args.repeat // 2))
    carry_kb = LOOP_WIDTH * 4 / 1024
    print(f"while_loop, {steps} steps, carry {carry_kb:.0f} KB (+ an int64 counter): peak memory one call adds "
          f"(fresh process each), time per call ({args.rounds} rounds):")
    base = mem["forward"]["added_kb"]
    for kind in models:
        added = mem[kind]["added_kb"]
        extra = "" if kind == "forward" else f"  (+{(added - base) / 1024:7.1f} MB over the forward, " \
            f"{(added - base) * 1024 / steps / 1024:5.2f} KB per step)"
        wall, cpu = [t[0] for t in res[kind]], [t[1] for t in res[kind]]
        print(f"  {kind:<10} peak +{added / 1024:7.1f} MB{extra}  wall median {statistics.median(wall) * 1e3:8.1f} "
              f"ms, best {min(wall) * 1e3:8.1f} ms; cpu {statistics.median(cpu) * 1e3:8.1f} ms")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--loop-steps", type=int, default=10000)
    p.add_argument("--only", choices=("lstm", "loop"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tree", help="a dyntvm source tree to import instead of the venv's (`git archive REV`)")
    p.add_argument("--loop-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.loop_child:
        return loop_memory_child(args.loop_child, args.loop_steps)
    print(f"dyntvm from {os.path.dirname(os.path.dirname(os.path.realpath(dt.__file__)))}")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.only in (None, "lstm"):
        bench_lstm(args)
    if args.only in (None, "loop"):
        bench_loop(args)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
