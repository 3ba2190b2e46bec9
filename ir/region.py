"""The `region` op: a static region cut out by the partitioner; its one subgraph is compiled as a unit."""
from __future__ import annotations

from dataclasses import dataclass

from .ops import REGION, register


@dataclass(frozen=True)
class RegionAttrs:
    name: str          # the compiled function's name (unique in a model, deterministic)


def _rule(ts, a):
    from .ops import ShapeError
    raise ShapeError("region types come from the region's subgraph")


register("region", RegionAttrs, _rule, kind=REGION)
