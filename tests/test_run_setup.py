"""The environment of every start of a run (run.json's segments, the source) and the report's flags on what
differs between runs or within one (analysis/run_setup.py)."""
import copy
import hashlib
import json
import subprocess

import pytest

from analysis import compare, sweep_report
from analysis.run_setup import flag_lines
from analysis.runs import load_runs
from test_sweep import fake_run
from training.runlog import RunLog, record_source

CONFIG = {"model": {"act": "aglu"}, "run": {"seed": 1}}


def starts(path):
    info = json.loads((path / "run.json").read_text())
    return [(s["start_step"], s["environment"]["n"]) for s in info["segments"]], info["environment"]["n"]


def test_run_json_keeps_one_segment_per_start_that_the_logs_keep(tmp_path):
    for resume_step, n in ((None, 1), (10, 2), (20, 3)):
        RunLog(tmp_path, resume_step=resume_step).write_run_info(CONFIG, {"n": n})
    assert starts(tmp_path) == ([(0, 1), (10, 2), (20, 3)], 3)
    RunLog(tmp_path, resume_step=15).write_run_info(CONFIG, {"n": 4})  # the logs from step 15 on are dropped too
    assert starts(tmp_path) == ([(0, 1), (10, 2), (15, 4)], 4)
    RunLog(tmp_path).write_run_info(CONFIG, {"n": 5})  # a fresh start
    assert starts(tmp_path) == ([(0, 5)], 5)
    # a run.json of an older nanoact: its one environment is kept as a start at a step it does not say
    (tmp_path / "run.json").write_text(json.dumps({"config": CONFIG, "environment": {"n": 6}}))
    RunLog(tmp_path, resume_step=30).write_run_info(CONFIG, {"n": 7})
    assert starts(tmp_path) == ([(None, 6), (30, 7)], 7)


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_source_records_the_commit_and_a_dirty_trees_diff(tmp_path, monkeypatch):
    repo, out = tmp_path / "repo", tmp_path / "out"
    repo.mkdir(), out.mkdir()
    git(repo, "init", "-q")
    (repo / "model.py").write_text("x = 1\n")
    git(repo, "add", "model.py")
    git(repo, "commit", "-q", "-m", "first")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert record_source(out, 0, repo) == {"commit": commit, "dirty": False}
    assert not list(out.iterdir())

    (repo / "model.py").write_text("x = 2\n")
    (repo / "new_act.py").write_text("y = 1\n")
    source = record_source(out, 120, repo)
    text = (out / "source_00120.diff").read_text()
    assert source == {"commit": commit, "dirty": True, "diff": "source_00120.diff",
                      "diff_sha256": hashlib.sha256(text.encode()).hexdigest()}
    assert text.startswith("# untracked: new_act.py\n") and "-x = 1\n+x = 2\n" in text
    assert record_source(out, 0, repo)["diff"] == "source.diff"

    plain = tmp_path / "plain"
    plain.mkdir()
    assert record_source(out, 0, plain)["commit"] is None and "not a git repository" in record_source(out, 0, plain)["why"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert record_source(out, 0, repo) == {"commit": None, "why": "git did not run (FileNotFoundError)"}


ENV = {"torch": "2.13.0", "triton": "3.5.0", "cuda": "12.8", "world_size": 8, "grad_accum": 1,
       "device_name": "NVIDIA H100 80GB HBM3",
       "decisions": {"precision": {"value": "bfloat16"}, "compile": {"value": True, "mode": "default"},
                     "activations": {"aglu": {"impl": "triton"}}},
       "source": {"commit": "c0ffee" * 6 + "0000", "dirty": False}}


def changed(**changes):
    env = copy.deepcopy(ENV)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        table = env
        for key in parents:
            table = table[key]
        table[leaf] = value
    return env


def write_setup(path, *segments):
    info = json.loads((path / "run.json").read_text())
    info["segments"] = [{"start_step": step, "environment": env} for step, env in segments]
    info["environment"] = segments[-1][1]
    (path / "run.json").write_text(json.dumps(info))


# the environment of relu seed 2 (of 2 seeds of aglu and relu); segments: it restarted at step 5
CASES = {
    "identical": ([(0, ENV)], None),
    "precision": ([(0, changed(decisions__precision={"value": "float16"}))],
                  "**precision differs between runs**: bfloat16 (aglu/seed1, aglu/seed2, relu/seed1); float16 (relu/seed2)"),
    "compile mode": ([(0, changed(decisions__compile__mode="max-autotune"))],
                     "**compile differs between runs**: on (default) (aglu/seed1, aglu/seed2, relu/seed1); "
                     "on (max-autotune) (relu/seed2)"),
    "world x accum": ([(0, changed(world_size=4, grad_accum=2))],
                      "**world size x grad accum differs between runs**: 8 x 1 (aglu/seed1, aglu/seed2, relu/seed1); "
                      "4 x 2 (relu/seed2)"),
    "torch": ([(0, changed(torch="2.12.1"))], "**torch differs between runs**: 2.13.0 (aglu/seed1, aglu/seed2, "
                                              "relu/seed1); 2.12.1 (relu/seed2)"),
    "dirty tree": ([(0, changed(source={"commit": "c0ffee" * 6 + "0000", "dirty": True, "diff": "source.diff",
                                        "diff_sha256": "ab" * 32}))],
                   "**code differs between runs**: c0ffeec0ffee (aglu/seed1, aglu/seed2, relu/seed1); c0ffeec0ffee + "
                   "uncommitted changes (diff sha256 abababababab) (relu/seed2)"),
    "kernel path at a restart": ([(0, ENV), (5, changed(decisions__activations={"aglu": {"impl": "torch"}}))],
                                 "**relu/seed2 changed kernel path at a restart**: from step 0: aglu Triton kernel; "
                                 "from step 5: aglu PyTorch."),
}


def sweep_dirs(out, segments):
    """aglu and relu, seeds 1 and 2, finished; relu seed 2 with `segments`, the others one start with ENV."""
    for act in ("aglu", "relu"):
        for seed in (1, 2):
            fake_run(out / f"{act}_seed{seed}", act, seed, 3.0 + seed / 10)
            write_setup(out / f"{act}_seed{seed}", *(segments if (act, seed) == ("relu", 2) else [(0, ENV)]))
    return sorted(p for p in out.iterdir() if p.is_dir())


def expected(flag):
    return [] if flag is None else [f"- {flag}" + ("; their differences are then also this setting's."
                                                  if "between" in flag else "")]


@pytest.mark.parametrize("case", CASES)
def test_flags_name_what_differs_between_runs_or_within_one(tmp_path, case):
    segments, flag = CASES[case]
    assert flag_lines(load_runs(sweep_dirs(tmp_path, segments))) == expected(flag)


def test_sweep_report_and_compare_state_the_flags(tmp_path, capsys):
    segments, flag = CASES["precision"]
    dirs = sweep_dirs(tmp_path, segments)
    text = sweep_report.report(tmp_path, acts=["aglu", "relu"])
    assert json.loads((tmp_path / "sweep.json").read_text())["setup_flags"] == expected(flag)
    compare.main([*map(str, dirs), "-o", str(tmp_path / "c.png")])
    assert expected(flag)[0] in text and expected(flag)[0] in capsys.readouterr().out


def test_a_run_json_of_an_older_nanoact_is_read(tmp_path):
    """No segments, a git string, no grad_accum: what it records is compared, the rest left out."""
    for seed, git_rev in ((1, "abc+dirty"), (2, "abc")):
        fake_run(tmp_path / f"aglu_seed{seed}", "aglu", seed, 3.0)
        info = json.loads((tmp_path / f"aglu_seed{seed}" / "run.json").read_text())
        (tmp_path / f"aglu_seed{seed}" / "run.json").write_text(json.dumps(
            {"config": info["config"], "environment": {"torch": "2.13.0", "world_size": 1, "git": git_rev}}))
    assert flag_lines(load_runs(sorted(tmp_path.iterdir()))) == [
        "- **code differs between runs**: abc+dirty (aglu/seed1); abc (aglu/seed2); their differences are then also "
        "this setting's."]
