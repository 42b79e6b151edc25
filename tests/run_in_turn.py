"""`torchrun ... tests/run_in_turn.py SCRIPT ARGV --- SCRIPT ARGV ...`: the project's scripts (paths from the
repository root) run one after another in the same workers, each as `python SCRIPT ARGV` would run it. One
torchrun job then serves several tests (the agent's and the workers' start-up is most of a tiny run's cost);
each run sets up and tears down its own process group, as a job of its own would.

`+++` in place of `---` (or before the first SCRIPT) marks a run that a test expects to stop with a one-line error
(SystemExit with a message): the message goes to stderr as Python prints it, the next run starts, and the job
ends with exit status 1. Any other end of a run (a traceback, another exit status) ends the job there."""
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEPARATORS = ("---", "+++")

if __name__ == "__main__":
    commands, status = sys.argv[1:], 0
    if commands[0] not in SEPARATORS:
        commands.insert(0, "---")
    while commands:
        may_fail = commands[0] == "+++"
        end = next((i for i, word in enumerate(commands[1:], 1) if word in SEPARATORS), len(commands))
        sys.argv = commands[1:end]
        try:
            runpy.run_path(str(ROOT / sys.argv[0]), run_name="__main__")
        except SystemExit as stop:
            if not (may_fail and isinstance(stop.code, str)):
                raise
            print(stop.code, file=sys.stderr, flush=True)
            status = 1
        commands = commands[end:]
    sys.exit(status)
