"""autograph reads the function's text from its file: a file edited after the function was defined (the text no
longer what Python runs) is refused with a TraceError naming the file, never converted from the new text; a text
that no longer parses is a TraceError naming file and line, not a raw SyntaxError."""
import numpy as np
import pytest

import dyntvm as dt

from test_autograph_cases import _module_from

SOURCE = "from dyntvm import F\n\n\ndef f(x):\n    if F.sum(x) > 0.0:\n        x = x * 2.0\n    return x\n"
VEC = (dt.TensorSpec(("N",)),)


def test_unchanged_file_converts_and_equals_python(tmp_path):
    module = _module_from(tmp_path, "fresh", SOURCE)
    g = dt.trace(dt.autograph(module.f), *VEC)
    for x in (np.array([1.0, -0.5], np.float32), np.array([-3.0], np.float32), np.zeros(0, np.float32)):
        np.testing.assert_allclose(dt.run_reference(g, x), module.f(x))


@pytest.mark.parametrize("edited", [
    SOURCE.replace("x * 2.0", "x * 3.0"),                      # the same lines, another constant
    SOURCE.replace("> 0.0", "> y"),                            # another name
    "# a new first line\n" + SOURCE,                           # the function moved down one line
])
def test_source_edited_after_import_is_refused(tmp_path, edited):
    module = _module_from(tmp_path, "stale", SOURCE)
    (tmp_path / "stale.py").write_text(edited)
    with pytest.raises(dt.TraceError, match=r"autograph: the source of f in .*stale\.py:4 is not the code Python "
                                            r"runs for it \(the file was edited"):
        dt.autograph(module.f)
    with pytest.raises(dt.TraceError, match="re-import the module"):
        dt.show_converted(module.f)


def test_source_that_no_longer_parses_is_a_trace_error_naming_file_and_line(tmp_path):
    module = _module_from(tmp_path, "broken", SOURCE)
    (tmp_path / "broken.py").write_text(SOURCE.replace("def f(x):\n    if", "def f(x):\n  if (").replace(
        "    return x", "    return x ]"))
    with pytest.raises(dt.TraceError, match=r"autograph: cannot (parse|read) the source of f .*broken\.py:4") as e:
        dt.autograph(module.f)
    assert not isinstance(e.value, SyntaxError)


MANGLED = '''from dyntvm import F


class Net:
    def __init__(self):
        self.__w = 3.0

    def forward(self, x):
        __scale = self.__w
        if F.sum(x) > 0.0:
            x = x * __scale
        return x + self.__bias()

    def __bias(self):
        def inner():
            return self.__w
        return inner()


def make():
    class _Local:
        __k = 2.0

        def forward(self, x):
            if F.sum(x) > 0.0:
                x = x * self.__k
            return x
    return _Local()
'''


def test_method_with_class_private_names_converts_and_equals_python(tmp_path):
    """Review 34 #6: `self.__w` in `class Net` is `self._Net__w` in the running code; the unedited file was
    refused as stale (the check compiled the def outside the class), and the converted method looked up `__w`."""
    module = _module_from(tmp_path, "mangled", MANGLED)
    for obj in (module.Net(), module.make()):
        g = dt.trace(dt.autograph(obj.forward), *VEC)
        for x in (np.array([1.0, -0.5], np.float32), np.array([-3.0], np.float32), np.zeros(0, np.float32)):
            np.testing.assert_allclose(dt.run_reference(g, x), obj.forward(x))
    assert "__scale" in dt.show_converted(module.Net.forward)


def test_edited_method_with_class_private_names_is_still_refused(tmp_path):
    module = _module_from(tmp_path, "mangled_stale", MANGLED)
    (tmp_path / "mangled_stale.py").write_text(MANGLED.replace("x * __scale", "x * self.__w * 2.0"))
    with pytest.raises(dt.TraceError, match=r"the source of Net.forward in .*mangled_stale\.py:8 is not the code"):
        dt.autograph(module.Net().forward)
