"""Pipeline stage 3 of 4 (`dyntvm.pipeline`): the regions of a partitioned graph -> a TVM kernel library.

`build.py` is the entry (targets, the compile cache in `cache.py`, build counters); `relax_builder.py`
lowers each region to a Relax function with the per-op converters of `converters/` (our dims -> TIR in
`dims.py`, hand-written TE computes in `te_kernels.py`); `cpu_schedule.py` (with `cpu_sched_helpers.py`,
`cpu_fast_math.py`) and `gpu.py` schedule and build. Codegen imports only the IR: neither the frontend, the partitioner nor the runtime.
"""
