"""Per-call costs of small models on a GPU (benchmarks/gpu_host.sh stage `calls`): the device buffer pool
(`runtime/placement.BufferPool`) on and off, interleaved in one process, for a one-kernel model and the small
workloads of bench_peers --gpu (branchy, detection, mask), compiled for CUDA; per call the median time, the device
buffers allocated and the host<->device copies; then a cProfile of the branchy example's call (where the rest of
its time goes). `python3 -P benchmarks/gpu_calls.py [ROUNDS] [--cpu]` (--cpu: the CPU's device path instead, to
check this script without a GPU: its times mean nothing)."""
from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _models(build, pool_bytes_off: int = 0):
    """(pool on, pool off): the same compiled model twice (the second from the compile cache), the second's
    executor made with a pool that keeps nothing (every buffer a fresh allocation, as before the pool)."""
    from dyntvm.runtime import placement
    on = build()
    saved = placement.POOL_BYTES
    placement.POOL_BYTES = pool_bytes_off
    try:
        off = build()
    finally:
        placement.POOL_BYTES = saved
    return on, off


def _block(model, args, seconds: float) -> list:
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        model(*args)
        times.append(time.perf_counter() - t0)
    return times


def main(argv) -> int:
    import tvm
    import dyntvm as dt
    from dyntvm import F, examples
    from peers import mask
    cpu = "--cpu" in argv
    argv = [a for a in argv if a != "--cpu"]
    rounds = int(argv[1]) if len(argv) > 1 else 5
    target = "cpu" if cpu else "cuda"

    def compiled(fn, *specs):
        def build():
            m = dt.compile(fn, *specs, target=target)
            if cpu:
                m._use_device_path(tvm.cpu())
            return m
        return build

    work = [("one kernel (v * 2 + 1, N=16)", compiled(lambda v: v * 2.0 + 1.0, dt.TensorSpec(("N",))),
             (np.ones(16, np.float32),))]
    for name, sizes in (("branchy", dict(B=1)), ("branchy", dict(B=16)), ("detection", dict(N=200))):
        ex = examples.get(name)
        work.append((f"ex. {name} {sizes}", compiled(ex.fn, *ex.specs),
                     ex.make_inputs(np.random.default_rng(0), **sizes)))
    mw = mask.workload(2000)
    work.append((mw.label, compiled(mask.dyntvm_mask_mlp, dt.TensorSpec(("N", mask.D))), mw.inputs))
    print("| model | ms pool on | ms pool off | off / on | allocations per call on / off | copies in / out |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, build, args in work:
        on, off = _models(build)
        for m in (on, off):
            m(*args)
        t_on, t_off = [], []
        a0 = (on.device_allocations, off.device_allocations)
        c0 = dict(on.device_copies)
        n_on = n_off = 0
        for _ in range(rounds):
            b = _block(on, args, 0.2)
            t_on += b
            n_on += len(b)
            b = _block(off, args, 0.2)
            t_off += b
            n_off += len(b)
        c1 = on.device_copies
        per = lambda key: (c1.get(key, 0) - c0.get(key, 0)) / n_on      # noqa: E731
        m_on, m_off = 1e3 * float(np.median(t_on)), 1e3 * float(np.median(t_off))
        print(f"| {label} | {m_on:.3f} | {m_off:.3f} | {m_off / m_on:.2f} | "
              f"{(on.device_allocations - a0[0]) / n_on:.2f} / {(off.device_allocations - a0[1]) / n_off:.2f} | "
              f"{per('host_to_device'):.1f} / {per('device_to_host'):.1f} |", flush=True)
    ex = examples.get("branchy")
    m = compiled(ex.fn, *ex.specs)()
    args = ex.make_inputs(np.random.default_rng(0), B=1)
    for _ in range(20):
        m(*args)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        m(*args)
    pr.disable()
    print("== cProfile: ex. branchy B1, 200 calls", flush=True)
    pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(16)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
