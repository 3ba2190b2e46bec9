"""The partition picture (`dyntvm inspect --svg`): everything drawn lies inside the canvas (title and legend of a
small graph included), labels fit their boxes (a long one is cut, its full text kept as the tooltip), subgraph
inputs carry the user's names, and every edge is labelled with the type of the value it carries."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import InputError
from dyntvm.partition.draw import ADVANCE, MAX_CHARS, draw_partition
from dyntvm.pipeline import partition_graph

S = dt.TensorSpec
NS = "{http://www.w3.org/2000/svg}"
W = np.random.default_rng(0).uniform(-1, 1, (16, 32)).astype(np.float32)


def small(x):
    return F.relu(x) + 1.0


def lstm(xs, h, c):
    def cell(x, states):
        h, c = states
        g = F.concat([x, h], axis=1) @ W
        i, f, o, u = F.split(g, 4, axis=1)
        c2 = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(u)
        h2 = F.sigmoid(o) * F.tanh(c2)
        return h2, [h2, c2]
    hs, (h, c) = F.foreach(cell, xs, [h, c])
    return F.boolean_mask(hs, F.sum(hs, axis=(1, 2)) > 0), h, c


def _draw(tmp_path, fn, *specs, name=None):
    path = tmp_path / "g.svg"
    draw_partition(partition_graph(dt.trace(fn, *specs, name=name)), str(path))
    return ET.parse(path).getroot()


def _text_box(t):
    """(x0, y0, x1, y1) of a <text> from its anchor, font size and character count (monospace)."""
    size = float(t.get("font-size"))
    w = len(t.text or "") * ADVANCE * size
    x, y = float(t.get("x")), float(t.get("y"))
    x0 = {"start": x, "middle": x - w / 2, "end": x - w}[t.get("text-anchor", "start")]
    return x0, y - size, x0 + w, y + size * 0.3


def _rect_box(r):
    x, y = float(r.get("x")), float(r.get("y"))
    return x, y, x + float(r.get("width")), y + float(r.get("height"))


def _inside(inner, outer, slack=0.5):
    return (inner[0] >= outer[0] - slack and inner[1] >= outer[1] - slack and inner[2] <= outer[2] + slack
            and inner[3] <= outer[3] + slack)


def _check_canvas(root):
    vx, vy, vw, vh = map(float, root.get("viewBox").split())
    canvas = (vx, vy, vx + vw, vy + vh)
    boxes = [_rect_box(r) for r in root.iter(NS + "rect")] + [_text_box(t) for t in root.iter(NS + "text")]
    boxes += [(min(float(ln.get("x1")), float(ln.get("x2"))), min(float(ln.get("y1")), float(ln.get("y2"))),
               max(float(ln.get("x1")), float(ln.get("x2"))), max(float(ln.get("y1")), float(ln.get("y2"))))
              for ln in root.iter(NS + "line")]
    outside = [b for b in boxes if not _inside(b, canvas)]
    assert not outside, f"{len(outside)} element(s) outside the viewBox {canvas}: {outside[:3]}"


def _nodes(root):
    """{first label line: (rect box, [text boxes], tooltip)} of every node box."""
    out = {}
    for g in root.iter(NS + "g"):
        if "node" in (g.get("class") or "").split():
            texts = g.findall(NS + "text")
            out[texts[0].text] = (_rect_box(g.find(NS + "rect")), [_text_box(t) for t in texts],
                                  g.find(NS + "title").text)
    return out


@pytest.mark.parametrize("fn, specs", [(small, [S(("N", 4))]),
                                       (lstm, [S(("T", "B", 8)), S(("B", 8)), S(("B", 8))])],
                         ids=["small", "lstm"])
def test_everything_inside_the_canvas_and_labels_in_their_boxes(tmp_path, fn, specs):
    root = _draw(tmp_path, fn, *specs)
    _check_canvas(root)
    texts = [t.text for t in root.iter(NS + "text")]
    assert any("compiled region(s)" in t for t in texts)                    # the title
    assert "compiled region" in " ".join(texts) and "dynamic-shape op" in " ".join(texts) or fn is small
    for label, (box, text_boxes, _) in _nodes(root).items():
        for tb in text_boxes:
            assert _inside(tb, box), f"label {label!r} spills out of its box"


def test_edges_are_labelled_with_types(tmp_path):
    root = _draw(tmp_path, lstm, S(("T", "B", 8)), S(("B", 8)), S(("B", 8)))
    lines = list(root.iter(NS + "line"))
    labels = [t.text for t in root.iter(NS + "text") if t.get("class") == "edge-label"]
    starts = {(ln.get("x1"), ln.get("y1")) for ln in lines}          # one label under each producer
    assert lines and len(labels) == len(starts)
    assert {"float32[T,B,8]", "float32[B,8]", "bool[T]"} <= set(labels)


def test_subgraph_inputs_carry_the_users_names(tmp_path):
    root = _draw(tmp_path, lstm, S(("T", "B", 8)), S(("B", 8)), S(("B", 8)))
    body = next(p for p in root.iter(NS + "g") if p.get("class") == "panel" and
                "subgraph" in p.find(NS + "text").text)
    inputs = {g.find(NS + "text").text for g in body.iter(NS + "g") if "input" in g.get("class").split()}
    assert inputs == {"xs[t]", "h", "c"}


def test_captured_intermediates_are_named_after_their_producer(tmp_path):
    def captures(x):
        y = F.relu(x)
        return F.cond(F.sum(x) > 0, lambda: y * 2, lambda: y + x)
    root = _draw(tmp_path, captures, S(("N", 4)))
    inputs = [g.find(NS + "text").text for g in root.iter(NS + "g") if "input" in g.get("class", "").split()]
    assert "x" in inputs and any(".out" in name for name in inputs)
    assert not [name for name in inputs if re.fullmatch(r"v\d+(_t)?", name)], inputs


def test_long_labels_are_cut_with_the_full_text_as_tooltip(tmp_path):
    name = "a_model_whose_name_is_much_longer_than_any_box_should_be"
    root = _draw(tmp_path, small, S(("N", 4)), name=name)
    _check_canvas(root)
    cut = [(label, tip) for label, (_, _, tip) in _nodes(root).items() if label.endswith("\u2026")]
    assert cut and all(len(label) == MAX_CHARS and tip.startswith(label[:-1]) and name in tip for label, tip in cut)


def test_png_path_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="writes SVG"):
        draw_partition(partition_graph(dt.trace(small, S(("N", 4)))), str(tmp_path / "g.png"))


def test_a_row_with_a_node_whose_predecessors_are_not_placed_yet(tmp_path):
    """An ONNX model with NonZero and a Loop: an output whose producer sits on a later row than its row used to
    crash the layout (`row.index` inside `row.sort`: the list is empty while it sorts)."""
    from test_inspect import dynamic_model      # tests/ is on sys.path
    path = tmp_path / "dyn.svg"
    draw_partition(partition_graph(dt.from_onnx(dynamic_model())), str(path))
    ET.parse(path)          # well-formed SVG
