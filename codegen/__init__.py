"""Pipeline stage 3 of 4 (`dyntvm.pipeline`): the regions of a partitioned graph -> a TVM kernel library.

`build.py` is the entry (targets, the compile cache in `cache.py`, build counters); `relax_builder.py`
and `converters.py` lower each region to a Relax function; `cpu_schedule.py` and `gpu.py` schedule and
build. Codegen imports only the IR: neither the frontend, the partitioner nor the runtime.
"""
