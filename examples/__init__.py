"""Bundled example models: deterministic weights from a seed, no downloads.

    ex = dyntvm.examples.get("lstm")
    graph = dt.trace(ex.fn, *ex.specs)
    inputs = ex.make_inputs(np.random.default_rng(0), T=64, B=1)
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

NAMES = ("lstm", "decoder", "detection", "branchy", "transformer")


@dataclass
class Example:
    name: str
    description: str
    fn: Callable                      # the model function (runs eagerly on numpy, traces)
    specs: tuple                      # one dt.TensorSpec per argument of fn
    make_inputs: Callable             # (rng, **sizes) -> tuple of numpy arrays, one per argument
    sizes: dict = field(default_factory=dict)       # default symbolic-dim values for make_inputs
    test_sizes: tuple = ()            # several size dicts for tests (incl. 1 and 0 where meaningful);
                                      # may also hold other make_inputs keywords (e.g. keep_fraction)


def get(name: str) -> Example:
    if name not in NAMES:
        raise KeyError(f"unknown example {name!r}; choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"dyntvm.examples.{name}").EXAMPLE
