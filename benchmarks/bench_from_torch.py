"""from_torch vs F: the bundled examples written in torch with torch.cond / while_loop / scan / map
(tests/torch_examples.py), imported with dt.from_torch, against the F versions (examples/*.py), both compiled, run
interleaved in one process on the same inputs; per-call microseconds (median of the rounds), and what each
compiled graph holds (regions, control-flow and host nodes), to explain a gap.

    python benchmarks/bench_from_torch.py [rounds] [example]   # default 7 rounds of ~0.3 s per side, every example

The decoder's torch version keeps its tokens in a fixed buffer of 48 with a length (torch.export's while_loop needs
loop values of fixed shape), the F version grows its sequence: the same tokens, not the same work per step.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import dyntvm as dt  # noqa: E402
from dyntvm import examples  # noqa: E402
from dyntvm.runtime.model import partition_summary  # noqa: E402
import torch_examples as tex  # noqa: E402

#: the sizes each torch program is exported at (torch.export specialises a dim of size 1)
EXPORT_SIZES = {"lstm": {"T": 3, "B": 2}, "decoder": {"P": 3}, "branchy": {"B": 4}, "detection": {"N": 50}}
#: (example, sizes, torch module, dynamic_shapes)
ROWS = [
    ("lstm", {"T": 64, "B": 1}, tex.LSTM, {"xs": {0: "T", 1: "B"}, "h0": {0: "B"}, "c0": {0: "B"}}),
    ("lstm", {"T": 64, "B": 16}, tex.LSTM, {"xs": {0: "T", 1: "B"}, "h0": {0: "B"}, "c0": {0: "B"}}),
    ("decoder", {"P": 3}, tex.Decoder, {"prompt": {0: "P"}, "max_steps": None}),
    ("branchy", {"B": 16}, tex.Branchy, {"x": {0: "B"}}),
    ("detection", {"N": 200}, tex.Detection, {"scores": {0: "N"}, "boxes": {0: "N"}}),
]


def contents(model) -> str:
    lines = partition_summary(model.graph)
    kinds = {}
    for ln in lines:
        key = ln.split(" ")[0] if ln.startswith("region") else ln.split("(")[-1].rstrip(")")
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))


def per_call(model, inputs, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        model(*inputs)
    return (time.perf_counter() - t0) / calls * 1e6


def main(rounds: int, only: str | None = None):
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} cores")
    models = {}
    for name, sizes, module, shapes in ROWS:
        if only is not None and name != only:
            continue
        ex = examples.get(name)
        if name not in models:
            example_inputs = ex.make_inputs(np.random.default_rng(0), **EXPORT_SIZES[name])
            models[name] = (dt.compile(ex.fn, *ex.specs),
                            dt.compile(dt.from_torch(module(), example_inputs, dynamic_shapes=shapes)))
        f_model, t_model = models[name]
        inputs = ex.make_inputs(np.random.default_rng(1), **sizes)
        f_out, t_out = f_model(*inputs), t_model(*inputs)
        if name != "decoder":           # the same computation: the same outputs (the decoder: the same tokens)
            for a, b in zip(f_out if isinstance(f_out, tuple) else (f_out,), t_out if isinstance(t_out, tuple)
                            else (t_out,)):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        t0 = time.perf_counter()
        f_model(*inputs)
        calls = max(10, min(2000, int(0.3 / max(time.perf_counter() - t0, 1e-6))))
        res = {"F": [], "from_torch": []}
        for _ in range(rounds):         # interleaved: the machine's load hits both sides alike
            res["F"].append(per_call(f_model, inputs, calls))
            res["from_torch"].append(per_call(t_model, inputs, calls))
        f_med, t_med = np.median(res["F"]), np.median(res["from_torch"])
        label = f"{name} {' '.join(f'{k}={v}' for k, v in sizes.items())}"
        print(f"{label:22s} F {f_med:10.1f} us   from_torch {t_med:10.1f} us   ratio {t_med / f_med:5.2f}   "
              f"(spread F {min(res['F']):.0f}-{max(res['F']):.0f}, torch {min(res['from_torch']):.0f}-"
              f"{max(res['from_torch']):.0f})", flush=True)
    for name, (f_model, t_model) in models.items():
        print(f"{name}: F graph [{contents(f_model)}]; from_torch graph [{contents(t_model)}]")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7, sys.argv[2] if len(sys.argv) > 2 else None)
