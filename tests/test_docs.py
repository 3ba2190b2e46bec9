"""The documentation site builds (`mkdocs build --strict`: broken links or anchors, pages outside `nav` fail),
its code blocks are valid Python, and the command-line reference names every option of the parser."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from readme_blocks import parse_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))


def test_mkdocs_build_strict(tmp_path):
    if shutil.which("mkdocs", path=os.path.join(sys.prefix, "bin")) is None:
        pytest.fail("mkdocs is not installed: it is in the dev extra (python3 dev.py test installs it)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")     # mkdocs-material's banner about MkDocs 2
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(ROOT, "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "WARNING" not in out, out
    for page in PAGES:
        assert (tmp_path / "site" / ("index.html" if page == "index.md" else page[:-3]) ).exists(), page


@pytest.mark.parametrize("page", PAGES)
def test_docs_python_blocks_compile(page):
    for b in parse_blocks(os.path.join(DOCS, page), name=f"docs/{page}"):
        assert not b.skip or b.lang, b
        if b.lang == "python":
            compile(b.code, f"docs/{page}:{b.line}", "exec")


def test_no_links_outside_a_clone():
    for page in PAGES + ["../README.md"]:
        text = open(os.path.join(DOCS, page), encoding="utf-8").read()
        assert "../shared" not in text, f"{page}: a clone has no ../shared"


def test_cli_reference_names_every_option():
    from dyntvm.cli import build_parser
    text = open(os.path.join(DOCS, "cli.md"), encoding="utf-8").read()
    sections = dict(re.findall(r"^## dyntvm (\w+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "cmd").choices     # the subparsers
    assert set(sections) == set(commands), (sorted(sections), sorted(commands))
    for name, sub in commands.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help", "-v", "--verbose"):
                    assert f"`{flag}" in sections[name], f"docs/cli.md, dyntvm {name}: {flag} is not documented"
