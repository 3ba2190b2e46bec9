"""benchmarks/bench_peers.py: every installed system computes what the numpy implementation does.

The suite's correctness check (no timing) on the smallest sizes of every workload. Peers that are not
installed (`pip install -e '.[bench]'`) are skipped. torch.compile runs with the "eager" backend here
(dynamo's capture, graph breaks and guards, without inductor's code generation, which takes 5-30 s per
workload); the benchmark itself uses the default backend.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_peers  # noqa: E402
from peers import SYSTEMS, BuildContext, all_workloads  # noqa: E402

WORKLOADS = all_workloads(smallest=True)
ALLOWED = (bench_peers.OK, bench_peers.NONE, bench_peers.NA)


@pytest.mark.parametrize("system", [s for s, _ in SYSTEMS])
def test_peers_match_numpy(system):
    missing = bench_peers.missing_modules(system)
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    bench_peers.configure(1, [system])          # one thread: correctness only, and fast on a busy machine
    ctx = BuildContext(threads=1, torch_backend="eager")
    built = 0
    for w in WORKLOADS:
        p, res = bench_peers.build_checked(w, system, ctx, w.reference())
        assert res["status"] in ALLOWED, (w.key, res)
        if p is not None:
            built += 1
            # the timing path runs too (a short block), and the results stay correct after repeated calls
            assert len(bench_peers.time_block(p, 0.0, min_calls=2)) == 2
            got = p.to_numpy(p.fn(*p.args)) if p.to_numpy else p.fn(*p.args)
            assert bench_peers.check(w.reference(), tuple(got), w) is None, w.key
        bench_peers.forget(system)
    assert built >= (1 if system in ("torch_lstm", "ort_lstm") else len(WORKLOADS))


def test_report_renders(tmp_path):
    """markdown() and chart() on a tiny report with every kind of cell."""
    w = WORKLOADS[0]
    results = {"numpy": {"status": "ok", "median_ms": 1.0}, "dyntvm": {"status": "ok", "median_ms": 0.5,
                                                                     "build_s": 1.0, "peak_mb": 3.0},
               "torch": {"status": "not installed"}, "torch_compile": {"status": "error", "reason": "boom"},
               "ort": {"status": "n/a", "reason": "cannot"}}
    report = {"machine": {"cpu": "cpu", "cores": 2, "loadavg": [0, 0, 0], "loadavg_end": [0, 0, 0]},
              "versions": {"numpy": "x"}, "threads": 2, "total_s": 1.0,
              "settings": {"quick": True, "rounds": 1, "block_s": 0.1, "pause_s": 0.1, "isolated_builds": True},
              "systems": {s: {"label": s, "installed": True} for s in results},
              "workloads": [{"key": w.key, "label": w.label, "group": w.group, "results": results,
                             "best_peer": "numpy", "dyntvm_over_best_peer": 0.5}]}
    md = bench_peers.markdown(report)
    assert "0.50 (numpy)" in md and "error [1]" in md and "not installed" in md and "n/a [2]" in md
    assert bench_peers.chart(report, str(tmp_path / "c.png"))
