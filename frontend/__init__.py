"""Pipeline stage 1 of 4 (`dyntvm.pipeline`): Python function -> Graph.

`tracer.py` (Builder, Tensor, `trace`) <- `ops.py` (the `F` functions) <- `tensor_methods.py` (Tensor
operators, from the op registry) and `control_flow.py` (cond, case, foreach, while_loop) <- `F.py`
(the `dyntvm.F` namespace). Eager calls run the runtime's numpy kernels; nothing here imports the
partitioner or codegen.
"""
from . import tensor_methods  # noqa: F401  (a Tensor gets its operators whenever the frontend loads)
