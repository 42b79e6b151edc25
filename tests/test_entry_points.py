"""The user's commands run from any directory without sys.path edits: the project is installed editable."""
from pathlib import Path

import pytest

from forked_scripts import run_forked

ROOT = Path(__file__).resolve().parents[1]
# bench/train_step.py: bench/gpu_check.py's step section imports it (bench.train_step) on a GPU
SCRIPTS = ["eval/hellaswag.py", "analysis/compare.py", "export/to_transformers.py", "data/fineweb.py",
           "bench/train_step.py"]


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """Every script's `python SCRIPT --help`, run in a directory that is not the project's (tests/forked_scripts.py:
    torch imported once for all)."""
    return run_forked({script: (str(ROOT / script), ["--help"]) for script in SCRIPTS},
                      tmp_path_factory.mktemp("elsewhere"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_in_a_package_folder_starts(script, started):
    assert started[script].status == 0, started[script]
    assert started[script].out.startswith("usage:")


def test_no_sys_path_edits():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if ".git" not in p.parts and "sys.path.insert" in p.read_text() and p.name != Path(__file__).name]
    assert offenders == []
