"""--wandb-project: a training run's records (telemetry included), resolved config and final summary in a
Weights & Biases run, read back from the offline run file (WANDB_MODE=offline); a resumed run continues the
same wandb run; without wandb installed, one line says how to get it."""
import json
import struct
import sys
import zlib
from pathlib import Path

import pytest

from test_train_gpt2 import args, train_in_process, write_corpus
from training.runlog import RunLog, _scalars


def wandb_records(run_file):
    """The protobuf records of a .wandb file: wandb's transaction log, a ":W&B" header (magic 0xBEE1, version 0)
    then LevelDB-log blocks of 32 KiB holding records (crc32, length, type; FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), "unknown .wandb file format version"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break  # zero fill: the end of what was written
        payload = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == crc, f"{run_file}: bad checksum at byte {pos}"
        pending += payload
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_offline_run(out_dir):
    """{run, config, history, summary, exit_code} of each offline run under OUT_DIR/wandb, oldest first."""
    import wandb

    wandb.teardown()  # run.finish() returns before the wandb-core service has written everything; this waits
    runs = []
    for run_file in sorted((Path(out_dir) / "wandb").glob("offline-run-*/run-*.wandb")):
        run = {"config": {}, "history": [], "summary": {}, "exit_code": None, "step_metric": {}}
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["run"] = record.run
                run["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in record.history.item})
            elif kind == "summary":
                run["summary"].update({i.key: json.loads(i.value_json) for i in record.summary.update if i.key})
            elif kind == "metric":
                run["step_metric"][record.metric.glob_name or record.metric.name] = record.metric.step_metric
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
        runs.append(run)
    return runs


def expected_rows(out_dir):
    """metrics.jsonl as the wandb rows RunLog logs: {"step", "train/loss", ..., "telemetry/layers/0/..."}."""
    rows = []
    for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step, kind = record.pop("step"), record.get("kind")
        record.pop("time")
        rows.append({"step": step, **{k if "/" in k else f"{kind}/{k}": v for k, v in _scalars(record)}})
    return rows


@pytest.fixture
def wandb_offline(monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.long  # ~3 CPU-s: wandb's import and a 6-step run
def test_gpt2_run_in_an_offline_wandb_run(tmp_path, wandb_offline):
    data, out = write_corpus(tmp_path / "data"), tmp_path / "aglu_run"
    train_in_process(args(data, out, act="aglu", max_steps=6, checkpoint_interval=3, wandb_project="nanoact-test"))
    (run,) = read_offline_run(out)
    assert (run["run"].project, run["run"].display_name, run["run"].run_id) == (
        "nanoact-test", "aglu_run", (out / "wandb_run_id").read_text().strip())
    info = json.loads((out / "run.json").read_text())
    resolved = {**info["config"], "environment": info["environment"]}  # run.json's config, and the environment
    assert {k: v for k, v in run["config"].items() if k != "_wandb"} == json.loads(json.dumps(resolved, default=str))
    assert run["config"]["model"]["act"] == "aglu" and run["config"]["run"]["wandb_project"] == "nanoact-test"
    # every number of every metrics.jsonl record, telemetry included, in the wandb history, row for row
    got = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run["history"]]
    want = expected_rows(out)
    assert got == want
    assert any("telemetry/layers/1/params/kappa" in row for row in got) and len(got) == 6 + 3
    val = [r["eval/val_loss"] for r in want if "eval/val_loss" in r]
    s = run["summary"]
    assert (s["final_step"], s["start_step"], s["final_val_loss"], s["best_val_loss"]) == (6, 0, val[-1], min(val))
    assert s["checkpoint"].endswith("model_00006.pt") and s["tokens"] == 6 * 128 and s["wall_time_s"] > 0
    assert run["exit_code"] == 0 and run["step_metric"]["*"] == "step"  # plotted against our step


def test_resumed_run_continues_its_wandb_run(tmp_path, wandb_offline, monkeypatch):
    import training.loop

    data, out = write_corpus(tmp_path / "data"), tmp_path / "run"
    argv = args(data, out, max_steps=6, checkpoint_interval=3, wandb_project="nanoact-test", wandb_run_name="r1")

    def crash_after_step_4(step, *a):  # a crash after the checkpoint of step 3, before that of step 6
        if step == 4:
            raise RuntimeError("node lost")
    monkeypatch.setattr(training.loop, "stop_if_not_finite", crash_after_step_4)
    with pytest.raises(RuntimeError, match="node lost"):
        train_in_process(argv)
    monkeypatch.undo()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train_in_process(argv + ["--resume"])
    first, second = read_offline_run(out)
    assert first["run"].run_id == second["run"].run_id and second["run"].display_name == "r1"
    assert first["exit_code"] == 1 and second["exit_code"] == 0  # the crash is a failed run, not a finished one
    assert [r["step"] for r in first["history"]] == [0, 0, 1, 2, 3, 4]  # evaluations at 0 and 4, then the crash
    assert [r["step"] for r in second["history"]] == [3, 4, 4, 5, 6]  # from the checkpoint on: step 4 again
    assert second["config"]["run"]["resume"] is True and second["summary"]["start_step"] == 3


def test_without_wandb_one_line_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(SystemExit, match=r"^--wandb-project needs the wandb package: pip install wandb$"):
        RunLog(tmp_path, wandb_project="nanoact-test")


def test_both_trainers_take_the_wandb_options():
    import train_gpt2
    import train_translation
    from training.config import load_config

    for cls in (train_gpt2.TrainConfig, train_translation.TrainConfig):
        cfg = load_config(cls, ["--wandb-project", "acts", "--wandb-run-name", "aglu-s1"])
        assert (cfg.run.wandb_project, cfg.run.wandb_run_name) == ("acts", "aglu-s1")
        assert load_config(cls, []).run.wandb_project is None


def test_online_without_a_login_is_one_line(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # a fresh wandb session, which reads the settings below
    for name in ("WANDB_API_KEY", "WANDB_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no saved login
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(SystemExit) as e:
        RunLog(tmp_path / "out", wandb_project="nanoact-test")
    assert str(e.value).startswith("--wandb-project: wandb could not start a run (") and "\n" not in str(e.value)
    assert "wandb login" in str(e.value) and "WANDB_MODE=offline" in str(e.value)
