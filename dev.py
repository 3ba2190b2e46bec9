#!/usr/bin/env python3
"""Bootstrap: create .venv, install dyntvm with its dev extra, then run a task. Needs only Python 3.11.

    python3 dev.py demo [ARGS...]   # the main job on a bundled example (default: the LSTM)
    python3 dev.py test [ARGS...]   # the whole test suite (pytest args may follow)
"""
import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.environ.get("DYNTVM_VENV", os.path.join(ROOT, ".venv"))
BIN = os.path.join(VENV, "bin")


def ensure_env():
    stamp = os.path.join(VENV, ".dyntvm-installed")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    if not os.path.exists(os.path.join(BIN, "python")):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    pip = [os.path.join(BIN, "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.check_call(pip + ["--upgrade", "pip", "setuptools>=68", "wheel"])
    subprocess.check_call(pip + ["-e", f"{ROOT}[dev]"])
    with open(stamp, "w") as f:
        f.write(want)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        sys.exit(__doc__)
    ensure_env()
    task, rest = sys.argv[1], sys.argv[2:]
    if task == "demo":
        cmd = [os.path.join(BIN, "dyntvm"), "demo"] + (rest or ["--example", "lstm"])
    else:
        cmd = [os.path.join(BIN, "python"), "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q"] + rest
    os.chdir(ROOT)
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
