"""Pipeline stage 3 of 4 (`dyntvm.pipeline`): the regions of a partitioned graph -> a TVM kernel library.

`build.py` is the entry (the compile cache in `cache.py`, build counters); `relax_builder.py`
lowers each region to a Relax function with the per-op converters of `converters/` (our dims -> TIR in
`dims.py`, hand-written TE computes in `te_kernels.py`); the target's backend (`backends/`: `cpu/` with
`cpu_schedule.py` and its rules, `cuda/` with `gpu.py`) schedules and builds. Codegen imports only the IR: neither the frontend, the partitioner nor the runtime.
"""
