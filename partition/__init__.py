"""Partitioning: node selectors and the cycle-free region partitioner."""
from .partitioner import contract, find_regions, partition  # noqa: F401
from .selector import OpListSelector, Selector, StaticRegionSelector  # noqa: F401
