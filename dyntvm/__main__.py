"""`python -m dyntvm ...`: the `dyntvm` command (works from a runtime-only bundle too)."""
import sys

from dyntvm.cli import main

sys.exit(main())
