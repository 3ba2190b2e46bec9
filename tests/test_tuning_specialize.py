"""Tuning specializations (`tuning.specialized_regions`) bind the hinted sizes everywhere a symbol appears: in
value types and in every symbolic attr, scalar ones included (an arange's stop: GPT-2's export failed with
"symbolic dim 'seq' ... is not bound" before)."""
import numpy as np

import dyntvm as dt
from dyntvm import F


def test_a_specialization_binds_scalar_symbolic_attrs():
    from dyntvm.codegen.backends import resolve
    from dyntvm.codegen.build import tuning_tasks
    from dyntvm.pipeline import partition_graph
    g = partition_graph(dt.trace(lambda x: x * F.cast(F.arange(0, x.shape[0]), "float32")[:, None] + 1.0,
                                 dt.TensorSpec(("N", 4))))
    target = resolve("cpu").concrete_target("cpu")
    kept, kernels, failed = tuning_tasks(g, {"N": [5, 9]}, target)
    assert failed == {}
    assert sorted(name for specs in kept.values() for _, name in specs) == \
        sorted(f"{r}__at_N{n}" for r in kept for n in (5, 9))
    assert kernels


def test_specialized_arange_computes_the_bound_sizes():
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.tuning import specialized_regions
    from dyntvm.pipeline import partition_graph
    g = partition_graph(dt.trace(lambda x: x * F.cast(F.arange(0, x.shape[0]), "float32")[:, None],
                                 dt.TensorSpec(("N", 4))))
    regions = collect_regions(g)
    (name, spec), = specialized_regions(regions, {regions[0][0]: [({"N": 5}, "r_at_N5")]})
    arange = next(n for n in spec.nodes if n.op == "arange")
    assert arange.attrs.stop == 5
    x = np.ones((5, 4), np.float32)
    out = dt.run_reference(spec, x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_array_equal(out, x * np.arange(5, dtype=np.float32)[:, None])
