"""``python -m verispec.distributed``: the SSD launch (``verispec/launch.py``, which runs the engine on the target
ranks; this entry point only calls it, see the import rule in docs/architecture.md)."""
import sys

from ..launch import main

if __name__ == "__main__":
    sys.exit(main())
