"""Reading an ONNX model for `frontend/onnx.py`: the file or `ModelProto`, its external data (read only from a
directory the caller named: the model file's, or `base_dir=` for a ModelProto, with onnx's own path checks), and
a bound on how deeply its subgraphs nest (checked without recursion, before anything walks them recursively)."""
from __future__ import annotations

import os

from dyntvm.errors import InputError

from .onnx_ops import OnnxImportError

# If / Loop / Scan bodies nested deeper than this are refused. Importing one level of If or Loop costs the Python
# stack 10-12 frames (converter, control-flow builder, tracer, subgraph run: Python's default limit of 1000 is hit
# near 90 levels), Scan of opset 8 twice that; 24 leaves room for the caller's own stack. A model parsed from a
# file cannot nest deeper than ~33 anyway (protobuf's parser stops at 100 levels of messages: graph, node and
# attribute per level); one built in memory can.
MAX_SUBGRAPH_DEPTH = 24


def load(model, base_dir=None):
    """The `ModelProto` of `model` (a path or a ModelProto), its external data read in: for a path from the
    model's directory (or `base_dir`), for a ModelProto only from `base_dir` (a copy is loaded; the caller's
    proto is left as it is). Raises InputError for what is not a readable model, OnnxImportError for a model
    nested too deep or whose external data cannot be read."""
    try:
        import onnx
    except ImportError:
        raise InputError("from_onnx: the `onnx` package is needed to read ONNX models (pip install onnx)") from None
    if base_dir is not None:
        if not isinstance(base_dir, (str, os.PathLike)) or not os.path.isdir(base_dir):
            raise InputError(f"from_onnx: base_dir must be an existing directory (where the model's external data "
                             f"files are), got {base_dir!r}")
        base_dir = os.fspath(base_dir)
    path = None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if os.path.isdir(path):
            raise InputError(f"from_onnx: {path!r} is a directory, not an ONNX model file")
        if not os.path.isfile(path):
            raise InputError(f"from_onnx: no such file {path!r}")
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
            raise InputError(f"from_onnx: {path!r} is not a readable ONNX model ({type(e).__name__}: {e})") from None
        if base_dir is None:
            base_dir = os.path.dirname(os.path.abspath(path))
    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"from_onnx: expected a path or an onnx.ModelProto, got {type(model).__name__}")
    if not model.HasField("graph"):         # an empty file, or another protobuf, parses as an empty ModelProto
        raise InputError(f"from_onnx: {'the model' if path is None else repr(path)} is not an ONNX model (it has "
                         "no graph)")
    check_nesting(model)
    check_text(model)
    return _with_external_data(model, base_dir, copy=path is None)


def _graphs_of(node):
    """The subgraphs of `node` (the attributes of If, Loop, Scan, SequenceMap...)."""
    for a in node.attribute:
        if a.HasField("g"):
            yield a.g
        yield from a.graphs


def check_nesting(model) -> None:
    """Refuses subgraphs (of the graph or of the model's functions) nested deeper than MAX_SUBGRAPH_DEPTH, walked
    with a stack: a model built in memory can nest deeper than any recursive walk survives (onnx's own walks
    over its tensors included)."""
    stack = [(model.graph, 0)] + [(f, 0) for f in model.functions]
    while stack:
        g, depth = stack.pop()
        for node in g.node:
            for sub in _graphs_of(node):
                if depth + 1 > MAX_SUBGRAPH_DEPTH:
                    raise OnnxImportError(f"from_onnx: node {node.name or node.op_type!r} ({node.op_type}) nests a "
                                          f"subgraph {depth + 1} levels deep; at most {MAX_SUBGRAPH_DEPTH} levels "
                                          "of If / Loop / Scan bodies are supported")
                stack.append((sub, depth + 1))


def check_text(model) -> None:
    """Refuses text fields (names, op types, attribute names...) that are not valid UTF-8: protobuf hands them
    over as bytes, which every later string operation would trip on."""
    from google.protobuf.descriptor import FieldDescriptor as FD
    stack = [model]
    while stack:
        msg = stack.pop()
        for field, value in msg.ListFields():
            many = field.is_repeated if hasattr(field, "is_repeated") else field.label == FD.LABEL_REPEATED
            if field.type == FD.TYPE_MESSAGE:
                stack.extend(value if many else [value])
            elif field.type == FD.TYPE_STRING:
                bad = next((v for v in (value if many else [value]) if not isinstance(v, str)), None)
                if bad is not None:
                    raise OnnxImportError(f"from_onnx: the {type(msg).__name__} field {field.name!r} holds "
                                          f"{bytes(bad)[:40]!r}, which is not UTF-8 text: the model is corrupt")


def walk_nodes(graph):
    """Every node of `graph` and of its subgraphs."""
    stack = [graph]
    while stack:
        for node in stack.pop().node:
            yield node
            stack.extend(_graphs_of(node))


def _external_tensors(model):
    from onnx.external_data_helper import _get_all_tensors, uses_external_data
    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


def _with_external_data(model, base_dir, copy: bool):
    """`model` with its external data read from `base_dir` by onnx (which refuses locations outside it: absolute
    paths, `..`, symlinks); external data without a base_dir is refused, never read relative to the current
    directory."""
    external = _external_tensors(model)
    if not external:
        return model
    names = ", ".join(repr(t.name) for t in external[:3]) + (f" and {len(external) - 3} more" if len(external) > 3
                                                              else "")
    if base_dir is None:
        raise OnnxImportError(f"from_onnx: tensor(s) {names} of the model keep their data in external files; for a "
                              "ModelProto give the directory of those files with from_onnx(model, base_dir=...) "
                              "(or pass the model's file path): it is never read from the current directory")
    if copy:
        import onnx
        model, given = onnx.ModelProto(), model
        model.CopyFrom(given)
    from onnx.external_data_helper import load_external_data_for_model
    try:
        load_external_data_for_model(model, base_dir)
    except Exception as e:  # noqa: BLE001 - onnx raises ValueError, OSError, its checker's errors
        raise OnnxImportError(f"from_onnx: the external data of tensor(s) {names} cannot be read from "
                              f"{base_dir!r} ({type(e).__name__}: {e})") from None
    return model
