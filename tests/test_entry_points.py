"""The user's commands run from any directory without sys.path edits: the project is installed editable.

tests/test_doc_commands.py starts every command the docs print from a folder that is not the project's, so each
script the docs name is started from elsewhere there (once, not a second time here); SCRIPTS are those a user starts
from anywhere, checked to be among them."""
from pathlib import Path

from test_doc_commands import doc_commands

ROOT = Path(__file__).resolve().parents[1]
# bench/train_step.py: bench/gpu_check.py's step section imports it (bench.train_step) on a GPU
SCRIPTS = ["eval/hellaswag.py", "analysis/compare.py", "export/to_transformers.py", "data/fineweb.py",
           "bench/train_step.py"]


def test_the_doc_commands_start_each_script_from_outside_the_project():
    assert set(SCRIPTS) <= {target for target, _ in doc_commands()}


def test_no_sys_path_edits():
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                 if ".git" not in p.parts and "sys.path.insert" in p.read_text() and p.name != Path(__file__).name]
    assert offenders == []
