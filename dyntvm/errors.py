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


class ExecutionError(DyntvmError):
    """A node failed while a graph ran (reference interpreter, compiled model or loaded artifact).

    The message names the op, the node, the failing condition and the user's source line; the
    original exception is the ``__cause__``. Attributes: ``op``, ``node`` (the failing node's name),
    ``source`` (``"file.py:12: code"`` or ``""``) and ``within``: the enclosing control-flow nodes,
    innermost first, as lines of text.
    """

    def __init__(self, message: str, op: str = "", node: str = "", source: str = ""):
        super().__init__(message)
        self.op, self.node, self.source = op, node, source
        self.within: list[str] = []
        self.iteration = None       # set by a loop driver, read by the loop node that encloses it

    def __str__(self):
        return "\n    ".join([self.args[0], *self.within])


class GraphError(DyntvmError):
    """A graph fails lint or cannot be (de)serialized."""
