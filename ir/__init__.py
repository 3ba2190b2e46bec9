from . import ops, region  # noqa: F401  (registers every op)
