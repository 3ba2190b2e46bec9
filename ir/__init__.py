"""The typed graph IR that every stage of the pipeline reads and writes; imports only itself and
`dyntvm.errors`."""
from . import ops, ops_checks, ops_dynamic, ops_index, ops_lists, ops_nn, ops_shape_tensors  # noqa: F401  (register every op)
