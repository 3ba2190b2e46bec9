"""benchmarks/profile_kernels.py on a tiny model: every PrimFunc call of a model call is reported once per model
call (the names and counts of the kernel calls the compiled library holds), shares add up to 1, the
convolution's FLOPs are counted at the call's sizes (symbolic dims bound from the arguments), and the model's
result is unchanged while profiled (each kernel runs in the hook, the VM skips its own call). Counts, not times."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

pytest.importorskip("tvm")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import profile_kernels as pk  # noqa: E402

RNG = np.random.default_rng(5)
W = RNG.standard_normal((16, 8, 3, 3)).astype("float32")
W2 = RNG.standard_normal((4, 16)).astype("float32")


def model(x):
    y = F.relu(F.conv(x, W, padding=1))
    return F.mean(y, axis=(2, 3)) @ W2.T


def test_profile_counts_every_kernel_call_once_per_model_call():
    with pk.Observed() as observed:
        m = dt.compile(model, dt.TensorSpec(("B", 8, "H", "W")), use_cache=False)
    x = RNG.standard_normal((2, 8, 9, 13)).astype("float32")
    want = m(x)
    rounds = 3
    stats = pk.profile_model(m, (x,), observed, rounds)
    np.testing.assert_allclose(m(x), want, rtol=1e-6)          # the hook is gone, the model as before
    text = m.lib.as_text() if hasattr(m.lib, "as_text") else None
    if text is not None:     # the library's kernel call instructions, each made once per model call here
        from dyntvm.ir.vm_program import PROGRAM
        program = text.split(f"\n@{PROGRAM}:", 1)[1].split("\n@", 1)[0] if m.vm_program else ""
        if m.vm_program and not set(re.findall(r"call\s+(\S+)\s+in:", program)) & set(m.regions):
            text = program   # the program holds copies of the region bodies: the regions' own functions do not run
        calls = [c for c in re.findall(r"call\s+(\S+)\s+in:", text) if c in observed.funcs]
        assert sorted(stats) == sorted(set(calls))
        assert sum(s.calls for s in stats.values()) == len(calls)
    assert all(s.calls >= 1 and len(s.times) == s.calls * rounds for s in stats.values())
    rows = pk.report(stats, rounds)
    assert abs(sum(r[3] for r in rows) - 1.0) < 1e-9
    conv = [s for name, s in stats.items() if "dt_conv" in name]
    assert len(conv) == 1 and conv[0].calls == 1
    macs = 2 * 16 * 8 * 9 * 9 * 13         # N * O * C * K * K * H * W
    flops = conv[0].flops / conv[0].counted
    # + the fused relu, padding and whole-tile rows (W = 13 in tiles of 4 or 8 positions: 16 computed, 1.23x)
    assert 2 * macs <= flops <= 2 * macs * 1.3, flops
