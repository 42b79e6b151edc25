"""The user's commands run from any directory without sys.path edits: the project is installed editable."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# bench/train_step.py: bench/gpu_check.py's step section imports it (bench.train_step) on a GPU
SCRIPTS = ["eval/hellaswag.py", "analysis/compare.py", "export/to_transformers.py", "data/fineweb.py",
           "bench/train_step.py"]
# `python SCRIPT --help` for each script, in a child forked from one `python -c` that has imported torch and
# nothing of the project: torch's import (~2 CPU-s) is paid once, not per script. The child sets what
# `python SCRIPT` sets (sys.path[0] the script's folder instead of -c's current directory, sys.argv, __main__);
# its stdout, stderr and exit status go to SCRIPT_NAME.{out,err,status} in the current directory.
FORK_PER_SCRIPT = r"""
import os, runpy, sys, traceback
import torch
for script in sys.argv[1:]:
    name = os.path.basename(script)
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(name + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.path[0], sys.argv = os.path.dirname(script), [script, "--help"]
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(status)
    with open(name + ".status", "w") as f:
        f.write(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """The directory (not the project's) where every script ran with --help."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    subprocess.run([sys.executable, "-c", FORK_PER_SCRIPT, *(str(ROOT / s) for s in SCRIPTS)], cwd=cwd, check=True,
                   timeout=300)
    return cwd


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_in_a_package_folder_starts(script, started):
    name = Path(script).name
    assert (started / f"{name}.status").read_text() == "0", (started / f"{name}.err").read_text()
    assert (started / f"{name}.out").read_text().startswith("usage:")


def test_no_sys_path_edits():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if ".git" not in p.parts and "sys.path.insert" in p.read_text() and p.name != Path(__file__).name]
    assert offenders == []
