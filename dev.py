#!/usr/bin/env python3
"""Bootstrap: create .venv, install dyntvm with its dev extra, then run a task. Needs only Python 3.11.

    python3 dev.py demo [ARGS...]   # the main job on a bundled example (default: the LSTM)
    python3 dev.py test [ARGS...]   # the whole test suite (pytest args may follow)
    python3 dev.py docs [ARGS...]   # build the documentation into site/ (or: docs serve)

Afterwards `source .venv/bin/activate` puts `dyntvm` (and the environment's python) on PATH.
"""
import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.realpath(__file__))      # realpath: a symlinked dev.py still finds its checkout
VENV = os.environ.get("DYNTVM_VENV", os.path.join(ROOT, ".venv"))
BIN = os.path.join(VENV, "bin")


def say(msg):
    print(f"dev.py: {msg}", file=sys.stderr, flush=True)


def ensure_env():
    stamp = os.path.join(VENV, ".dyntvm-installed")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    # say what is happening: the first install downloads ~800 MB, unpacks to ~2 GB and takes minutes
    if not os.path.exists(os.path.join(BIN, "python")):
        say(f"creating the virtual environment {VENV} ...")
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    pip = [os.path.join(BIN, "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    say("updating pip, setuptools and wheel ...")
    subprocess.check_call(pip + ["-q", "--upgrade", "pip", "setuptools>=68", "wheel"])
    say("installing dyntvm and its dependencies (TVM, numpy, onnx, pytest, mkdocs, ...; a few minutes the "
        "first time) ...")
    subprocess.check_call(pip + ["--progress-bar", "on", "-e", f"{ROOT}[dev]"])
    say(f"installed; next time this step is skipped (until pyproject.toml changes). The `dyntvm` command is "
        f"{os.path.join(BIN, 'dyntvm')} (or run `source {os.path.join(VENV, 'bin', 'activate')}`)")
    with open(stamp, "w") as f:
        f.write(want)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test", "docs"):
        sys.exit(__doc__)
    ensure_env()
    task, rest = sys.argv[1], sys.argv[2:]
    if task == "demo":
        cmd = [os.path.join(BIN, "dyntvm"), "demo"] + (rest or ["--example", "lstm"])
    elif task == "docs":
        cmd = [os.path.join(BIN, "mkdocs")] + (rest or ["build", "--strict"])
        os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")   # mkdocs-material's banner about MkDocs 2.0, not about us
    else:
        cmd = [os.path.join(BIN, "python"), "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q"] + rest
    os.chdir(ROOT)
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
