"""`python -m analysis.sweep ...`, the sweep's command before it moved to `python -m sweep` (sweep/cli.py): kept for
one release, it says so on stderr and runs the same command there. It runs that command as `python -m sweep` does
(runpy) instead of importing it: analysis/ lies below sweep/, which reads its reports."""
import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m analysis.sweep` is `python -m sweep` now; this name goes in the next release",
          file=sys.stderr)
    runpy.run_module("sweep", run_name="__main__", alter_sys=True)
