"""README.md can be followed verbatim: every python / bash block runs, in order, in a fresh folder.

The folder holds what a clone after the quick start holds for the reader: `dev.py` and `deploy/` (links to this
checkout's) and `.venv` (a link to the environment running the tests), so `python3 dev.py demo` and
`source .venv/bin/activate` work as written; bash blocks run with that environment activated.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from readme_blocks import block_dicts, parse_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DRIVER = os.path.join(ROOT, "tests", "readme_blocks.py")


def test_readme_blocks_are_runnable_kinds():
    blocks = parse_blocks(README)
    assert blocks, "README.md has no code blocks"
    for b in blocks:
        assert b.lang in ("python", "bash"), f"README.md:{b.line}: a ```{b.lang} block (python or bash only)"
    skipped = [b for b in blocks if b.skip]
    # only the test suite itself (which runs this test) may be skipped
    assert [b.code.split()[:3] for b in skipped] == [["python3", "dev.py", "test"]], skipped


def test_readme_links_resolve_in_a_clone():
    text = open(README, encoding="utf-8").read()
    assert "../shared" not in text, "a clone has no ../shared"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), f"README.md links {target}, which does not exist"


def _environment_made_by_dev_py() -> bool:
    stamp = os.path.join(sys.prefix, ".dyntvm-installed")
    import hashlib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    return os.path.exists(stamp) and open(stamp).read() == want


@pytest.mark.slow
def test_readme_runs_verbatim(tmp_path):
    if not _environment_made_by_dev_py():
        pytest.skip("the running environment was not installed by dev.py from this pyproject.toml "
                    "(`python3 dev.py demo` would reinstall it)")
    os.symlink(os.path.join(ROOT, "dev.py"), tmp_path / "dev.py")
    os.symlink(sys.prefix, tmp_path / ".venv")
    os.symlink(os.path.join(ROOT, "deploy"), tmp_path / "deploy")      # the C++ runner's sources, as in a clone
    blocks = [b for b in parse_blocks(README) if not b.skip]
    (tmp_path / "blocks.json").write_text(json.dumps(block_dicts(blocks)))
    bin_dir = os.path.join(sys.prefix, "bin")
    env = dict(os.environ, DYNTVM_VENV=sys.prefix, VIRTUAL_ENV=sys.prefix,
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONHOME", None)
    r = subprocess.run([os.path.join(bin_dir, "python"), DRIVER, "blocks.json"], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    ran = re.findall(r"^--- README\.md:(\d+) done in", out, re.M)
    assert [int(n) for n in ran] == [b.line for b in blocks], out[-3000:]
    # what the blocks say they make
    for made in ("m.dtvm", "out/output_0.npy", "out_cpp/output_0.npy", "model.onnx", "my_model.py", "xs.npy"):
        assert (tmp_path / made).exists(), made
    # the C++ runner's result is dyntvm run's
    np.testing.assert_allclose(np.load(tmp_path / "out_cpp/output_0.npy"), np.load(tmp_path / "out/output_0.npy"),
                               rtol=1e-5, atol=1e-6)
    assert "compiled is" in out and "than plain numpy" in out          # the quick start's demos
