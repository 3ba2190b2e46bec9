"""The `dyntvm` command line."""
from __future__ import annotations

import argparse
import sys
import time


def _demo(args) -> int:
    import numpy as np

    import dyntvm as dt
    from dyntvm import examples
    ex = examples.get(args.example)
    t0 = time.perf_counter()
    graph = dt.trace(ex.fn, *ex.specs)
    t_trace = time.perf_counter() - t0
    print(f"# example {ex.name}: {ex.description}")
    print(graph)
    inputs = ex.make_inputs(np.random.default_rng(0), **ex.sizes)
    t0 = time.perf_counter()
    eager = ex.fn(*inputs)
    t_eager = time.perf_counter() - t0
    ref = dt.run_reference(graph, *inputs)
    from dyntvm.ir.tree import tree_flatten
    e_leaves, r_leaves = tree_flatten(eager)[0], tree_flatten(ref)[0]
    ok = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(e_leaves, r_leaves))
    print(f"traced in {t_trace * 1e3:.1f} ms; sizes {ex.sizes}")
    for i, a in enumerate(e_leaves):
        print(f"output {i}: {np.asarray(a).dtype}{list(np.shape(a))}")
    print(f"eager numpy: {t_eager * 1e3:.2f} ms; reference interpreter matches eager: {ok}")
    return 0 if ok else 1


def main(argv=None) -> int:
    from dyntvm.errors import DyntvmError
    p = argparse.ArgumentParser(prog="dyntvm", description="Compile dynamic neural networks with Apache TVM.")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="trace and run a bundled example")
    d.add_argument("--example", default="lstm", help="lstm | decoder | detection | branchy | transformer")
    d.set_defaults(func=_demo)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except (DyntvmError, KeyError, FileNotFoundError) as e:
        if args.verbose:
            raise
        print(f"dyntvm {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
