"""Pipeline stage 2 of 4 (`dyntvm.pipeline`): node selectors and the cycle-free region partitioner.

`partition(graph)` groups static nodes into `region` nodes (recursing into control-flow bodies); the
pipeline then folds input-less regions (`dyntvm.runtime.fold`) and hands the regions to codegen.
Imports only the IR.
"""
from .partitioner import contract, find_regions, partition  # noqa: F401
from .selector import OpListSelector, Selector, StaticRegionSelector  # noqa: F401
