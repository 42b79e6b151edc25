"""The user's commands run from any directory without sys.path edits: the project is installed editable."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# bench/train_step.py: bench/gpu_check.py's step section imports it (bench.train_step) on a GPU
@pytest.mark.parametrize("script", ["eval/hellaswag.py", "analysis/compare.py", "export/to_transformers.py",
                                    "data/fineweb.py", "bench/train_step.py"])
def test_script_in_a_package_folder_starts(script, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


def test_no_sys_path_edits():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if ".git" not in p.parts and "sys.path.insert" in p.read_text() and p.name != Path(__file__).name]
    assert offenders == []
