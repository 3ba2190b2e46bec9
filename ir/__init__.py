"""The typed graph IR that every stage of the pipeline reads and writes; imports only itself and
`dyntvm.errors`."""
from . import ops  # noqa: F401  (registers every op)
