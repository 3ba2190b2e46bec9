"""The dyntvm error hierarchy. Messages say: which API, which rule, what was got, and a hint."""


class DyntvmError(Exception):
    """Base class of every error dyntvm raises on purpose."""


class TraceError(DyntvmError):
    """A model function cannot be traced (bad control-flow use, type mismatch...)."""


class CompileError(DyntvmError):
    """A graph cannot be partitioned, lowered or built."""


class UnsupportedOpError(CompileError):
    """An op (or ONNX/torch node) has no converter."""


class InputError(DyntvmError, ValueError):
    """Arguments given to a model do not match its signature."""


class ArtifactError(DyntvmError):
    """A saved artifact is missing, corrupt, or from an incompatible version."""


class GraphError(DyntvmError):
    """A graph fails lint or cannot be (de)serialized."""
