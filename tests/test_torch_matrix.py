"""bench/torch_matrix.py without installing anything: the commands it would run (--dry-run), the row it makes of a
suite's junit XML, and docs/install.md's table rewritten with it."""
from pathlib import Path

from bench import torch_matrix

ROOT = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_one" time="0.1"/>
<testcase classname="tests.test_a" name="test_two" time="0.1"><failure message="boom">trace</failure></testcase>
<testcase classname="tests.test_b" name="test_three" time="0"><skipped message="../shared not present"/></testcase>
<testcase classname="tests.test_b" name="test_four" time="0"><skipped message="../shared not present"/></testcase>
<testcase classname="tests.test_c" name="test_five" time="0"><error message="in its fixture"/></testcase>
</testsuite></testsuites>"""


def row(version, outcomes):
    return {"torch": version, "triton": "3.6.0", **outcomes, "seconds": 300, "workers": 2, "date": "2026-11-28",
            "command": f"python bench/torch_matrix.py {version}"}


def test_a_suites_outcomes_make_one_table_row(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    outcomes = torch_matrix.outcomes(tmp_path / "junit.xml")
    assert outcomes == {"passed": 1, "failed": ["test_a::test_two", "test_c::test_five"],
                        "skipped": {"../shared not present": 2}}
    assert torch_matrix.table_row(row("2.11.0", outcomes)) == (
        "| 2.11.0 | 3.6.0 | 1 / 2 / 2 | 2: ../shared not present | test_a::test_two, test_c::test_five | "
        "2026-11-28, `python bench/torch_matrix.py 2.11.0`: 300 s on 2 workers |")


def test_the_docs_table_gets_each_versions_row_and_keeps_the_others(tmp_path):
    doc = tmp_path / "install.md"
    doc.write_text(f"before\n\n{torch_matrix.TABLE_HEADER}\n|---|---|---|---|---|---|\n"
                   "| 2.13.0+cpu | 3.9.0 | kept |\n| 2.11.0 | 3.6.0 | replaced |\n\nafter\n")
    clean = {"passed": 5, "failed": [], "skipped": {}}
    torch_matrix.update_docs(doc, [row("2.11.0", clean), row("2.14.1", clean)])
    lines = doc.read_text().splitlines()
    assert lines[4:] == [torch_matrix.table_row(row("2.14.1", clean)), "| 2.13.0+cpu | 3.9.0 | kept |",
                         torch_matrix.table_row(row("2.11.0", clean)), "", "after"]  # newest first
    assert torch_matrix.TABLE_HEADER in (ROOT / "docs" / "install.md").read_text().splitlines()  # --docs finds it


def test_dry_run_prints_every_step_and_installs_nothing(tmp_path, capsys):
    assert torch_matrix.main(["2.11.0", "--venvs", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    python = tmp_path / "torch-2.11.0" / "bin" / "python"
    assert f"{python} -m pip install --quiet torch==2.11.0\n" in out
    assert f"PYTHONPATH={ROOT} {python} -m pytest -n 2 --dist loadgroup" in out
    assert list(tmp_path.iterdir()) == []
    kept = torch_matrix.requirements_without_torch(ROOT / "requirements.txt").splitlines()
    assert not [line for line in kept if line.startswith(("torch", "-e"))] and "pytest>=8" in kept
