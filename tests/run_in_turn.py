"""`torchrun ... tests/run_in_turn.py SCRIPT ARGV --- SCRIPT ARGV ...`: the project's scripts (paths from the
repository root) run one after another in the same workers, each as `python SCRIPT ARGV` would run it. One
torchrun job then serves several tests (the agent's and the workers' start-up is most of a tiny run's cost);
each run sets up and tears down its own process group, as a job of its own would."""
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    commands = sys.argv[1:]
    while commands:
        end = commands.index("---") if "---" in commands else len(commands)
        sys.argv = commands[:end]
        runpy.run_path(str(ROOT / sys.argv[0]), run_name="__main__")
        commands = commands[end + 1:]
