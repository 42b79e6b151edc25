"""`python -m analysis.sweep ...`, the sweep's command before it moved to `python -m sweep` (sweep/cli.py): kept for
one release, it says so on stderr and runs the same command there."""
import sys

from sweep.cli import main

if __name__ == "__main__":
    print("note: `python -m analysis.sweep` is `python -m sweep` now; this name goes in the next release",
          file=sys.stderr)
    main()
