from . import ops  # noqa: F401  (registers every op)
