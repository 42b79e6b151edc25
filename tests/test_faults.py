"""What breaks at scale, on the CPU with gloo: a worker lost under torchrun --max-restarts, two torchrun nodes,
a checkpoint that would run code or is not ours, a corrupt newest checkpoint, a full disk, a stalled rank,
and data preparation killed mid-way."""
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import errors
from errors import DistributedError
from test_data import fineweb  # noqa: F401 (a fixture: data.fineweb with an offline tokenizer, or a skip)
from test_train_gpt2 import ROOT, args, cli_error, final_weights, train_in_process, train_losses, write_corpus
from two_rank_runs import GPT_RUNS
from training import checkpoint
from training.checkpoint import load_checkpoint
from training.distributed import Dist
from training.stop import GracefulStop


def torchrun(argv, log, *launcher, env=None, script=ROOT / "train_gpt2.py"):
    """train_gpt2.py (or `script`) under torchrun in the background, stdout and stderr into the file `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, str(script), *map(str, argv)]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def wait_for(condition, proc, what, seconds=180):
    deadline = time.time() + seconds
    while not condition():
        assert proc.poll() is None, f"torchrun ended before {what}"
        assert time.time() < deadline, f"no {what} after {seconds}s"
        time.sleep(0.02)


def worker_pid(launcher_pid, rank):
    """The pid of the worker with this RANK among the launcher's children."""
    for task in Path(f"/proc/{launcher_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ:
                return int(child)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_same_weights(a, b):
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc (Linux)")
def test_a_worker_lost_on_two_torchrun_nodes_resumes_to_the_uninterrupted_end(tmp_path, two_rank_runs):
    """docs/fault_tolerance.md's multi-node recipe (c10d rendezvous, --max-restarts, a fresh store per round) as two
    1-process nodes on 127.0.0.1 under --dist fsdp, one worker killed by kill -9: both agents restart their worker,
    the group re-forms, training resumes from the newest sharded checkpoint (each rank's shard of the weights and
    of AdamW's moments) and ends with the weights of 2 ranks that were never interrupted (tests/two_rank_runs.py's
    "elastic": the same arguments, dropout included, whose masks are seeded by the step and the micro-batch's place
    in the data, training/loop.py's micro_batch_seeds). DDP's 2-rank resume: tests/test_train_gpt2.py's "noise"."""
    data, straight = two_rank_runs / "gpt_data", two_rank_runs / "elastic"
    end = GPT_RUNS["elastic"]["max_steps"]
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [torchrun(args(data, tmp_path / "nodes", **GPT_RUNS["elastic"]), tmp_path / f"node{rank}.log", "--nnodes",
                      "2", "--nproc_per_node", "1", "--node-rank", str(rank), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", endpoint, "--rdzv-id", "loopback", "--max-restarts", "1",
                      env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}) for rank in (0, 1)]
    wait_for(lambda: (tmp_path / "nodes" / "model_00004.dcp").exists(), nodes[0], "a checkpoint at step 4")
    os.kill(next(filter(None, (worker_pid(node.pid, rank=1) for node in nodes))), signal.SIGKILL)
    for rank, node in enumerate(nodes):
        assert node.wait(timeout=300) == 0, (tmp_path / f"node{rank}.log").read_text()
    survivor, logs = (tmp_path / "node0.log").read_text(), (tmp_path / "node1.log").read_text()
    restart = re.search(r"^restart 1: resuming \S*model_(\d{5})\.dcp at step (\d+)$", survivor + logs, re.M)
    assert "world 2" in survivor and restart and int(restart[1]) == int(restart[2]), survivor + logs
    assert 4 <= int(restart[2]) < end, "the kill came after the end: nothing was tested"
    assert "[rank0]: Traceback" not in survivor  # the survivor ends its attempt with one line (lost a peer)
    assert train_losses(tmp_path / "nodes") == train_losses(straight)
    ours, theirs = (load_checkpoint(run / f"model_{end:05d}.dcp")["model"] for run in (straight, tmp_path / "nodes"))
    assert_same_weights(ours, theirs)


def test_several_nodes_with_restarts_need_a_fresh_store_per_round(monkeypatch):
    """Agents count restarts apart, so a shared store cannot be split by attempt: one line says what to set."""
    from training import distributed

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", GROUP_WORLD_SIZE="2",
                           TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_MAX_RESTARTS="1").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DistributedError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        distributed.setup("cpu")


class WouldCreateAFile:
    """What a crafted checkpoint holds: unpickling it calls open(marker, "w")."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path, make_checkpoint):
    import eval.hellaswag

    marker = tmp_path / "marker"
    good = torch.load(make_checkpoint(), weights_only=True)
    crafted = tmp_path / "run" / "model_00001.pt"
    crafted.parent.mkdir()
    torch.save({**good, "step": 1, "model_config": WouldCreateAFile(marker)}, crafted)
    torch.load(crafted, weights_only=False)  # the file is potent: a plain pickle load creates the marker
    assert marker.exists()
    marker.unlink()

    with pytest.raises(checkpoint.CheckpointError) as refused:
        try:
            checkpoint.load_checkpoint(crafted)
        finally:
            assert not marker.exists(), "loading the checkpoint ran the code in it"
    message = str(refused.value)
    assert message.startswith(f"{crafted}: refused") and "io.open" in message and "\n" not in message
    with pytest.raises(SystemExit) as cli:  # as the issue found it: scoring a shared checkpoint
        eval.hellaswag.main([str(crafted), "--device", "cpu"])
    assert cli.value.code.startswith("error: ") and str(crafted) in cli.value.code and "\n" not in cli.value.code
    error = cli_error(["--out-dir", str(crafted.parent), "--resume", "--device", "cpu"])  # not skipped as "corrupt"
    assert "refused" in error and "\n" not in error
    assert not marker.exists()


def test_files_that_are_not_nanoact_checkpoints_give_one_line(tmp_path):
    files = {"empty.pt": b"", "noise.pt": os.urandom(4096), "text.pt": b"hello\n"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign_dict.pt")
    torch.save([torch.zeros(2)], tmp_path / "a_list.pt")
    torch.save({"kind": "gpt2", "model": {}}, tmp_path / "incomplete.pt")
    for path in sorted(tmp_path.iterdir()):
        with pytest.raises(checkpoint.CheckpointError) as error:
            load_checkpoint(path, kind="gpt2")
        message = str(error.value)
        assert message.startswith(str(path)) and "\n" not in message, message
    assert "no 'model_config', 'step' entries" in str(pytest.raises(
        checkpoint.CheckpointError, checkpoint.load_checkpoint, tmp_path / "incomplete.pt").value)


def tiny_state(step):
    return {"kind": "gpt2", "model": {"w": torch.full((64,), float(step))}, "model_config": {}, "step": step}


def flip_a_byte(path, offset=-100):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_checksums_catch_damage_and_resume_takes_the_newest_good(tmp_path):
    out = tmp_path / "run"
    for step in (2, 4, 6):
        checkpoint.save_checkpoint(tiny_state(step), out, step)
    assert (out / "model_00006.pt.sha256").read_text().split() == [
        __import__("hashlib").sha256((out / "model_00006.pt").read_bytes()).hexdigest(), "model_00006.pt"]
    assert checkpoint.verify_checksum(out / "model_00006.pt")
    flip_a_byte(out / "model_00006.pt")  # a bit flip torch.load itself may not notice
    raw = (out / "model_00004.pt").read_bytes()
    (out / "model_00004.pt").write_bytes(raw[:len(raw) // 2])  # a truncated copy
    with pytest.raises(checkpoint.CorruptCheckpoint, match="model_00006.pt: corrupt or truncated"):
        checkpoint.load_checkpoint(out / "model_00006.pt")
    ckpt, skipped = checkpoint.newest_good_checkpoint(out, "gpt2", Dist())
    assert ckpt["step"] == 2 and len(skipped) == 2 and "model_00006.pt" in skipped[0] and "model_00004.pt" in skipped[1]
    (out / "model_00002.pt").write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in .* can be used"):
        checkpoint.newest_good_checkpoint(out, "gpt2", Dist())


def test_a_corrupt_newest_checkpoint_resumes_from_the_one_before(tmp_path, capsys):
    data = write_corpus(tmp_path / "data")
    extra = dict(max_steps=10, checkpoint_interval=2, keep_checkpoints=10, dropout=0.1)
    train_in_process(args(data, tmp_path / "straight", **extra))
    train_in_process(args(data, tmp_path / "damaged", **extra))
    flip_a_byte(tmp_path / "damaged" / "model_00010.pt")
    capsys.readouterr()
    train_in_process(args(data, tmp_path / "damaged", resume="true", **extra))
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if "corrupt" in line)
    assert "model_00010.pt: corrupt or truncated" in line and re.search(r"resuming \S*model_00008\.pt", line)
    assert "done: steps 8-10" in printed
    assert_same_weights(final_weights(tmp_path / "straight", 10), final_weights(tmp_path / "damaged", 10))
    assert train_losses(tmp_path / "damaged") == train_losses(tmp_path / "straight")


def test_keep_checkpoints_deletes_nothing_before_the_new_one_verifies(tmp_path, monkeypatch):
    out = tmp_path / "run"
    checkpoint.save_checkpoint(tiny_state(2), out, 2, keep_last=1)
    write = checkpoint._HashingWriter.write

    def lossy_disk(self, data):  # hashes every byte, but the disk keeps all but the last one of each write
        self.sha256.update(data)
        return self.f.write(data[:-1])

    monkeypatch.setattr(checkpoint._HashingWriter, "write", lossy_disk)
    with pytest.raises(checkpoint.CheckpointError) as failed:
        checkpoint.save_checkpoint(tiny_state(4), out, 4, keep_last=1)
    assert "model_00004.pt failed" in str(failed.value) and "newest: model_00002.pt" in str(failed.value)
    assert checkpoint.verify_checksum(out / "model_00002.pt")  # still there, still good
    assert checkpoint.newest_good_checkpoint(out, "gpt2", Dist())[0]["step"] == 2
    monkeypatch.setattr(checkpoint._HashingWriter, "write", write)
    checkpoint.save_checkpoint(tiny_state(6), out, 6, keep_last=1)
    assert sorted(p.name for p in out.iterdir()) == ["model_00006.pt", "model_00006.pt.sha256"]


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_checkpoints(tmp_path, monkeypatch):
    write = checkpoint._HashingWriter.write

    def disk_full_at_step_4(self, data):
        if "model_00004" in self.f.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)

    monkeypatch.setattr(checkpoint._HashingWriter, "write", disk_full_at_step_4)
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    error = cli_error(args(data, tmp_path / "out", checkpoint_interval=2))
    assert error.startswith("error: saving ") and "model_00004.pt failed (No space left on device; " in error
    assert "newest: model_00002.pt" in error and "\n" not in error
    assert sorted(p.name for p in (tmp_path / "out").glob("*.pt*")) == ["model_00002.pt", "model_00002.pt.sha256"]
    assert not list((tmp_path / "out").glob(".*tmp*"))
    assert checkpoint.verify_checksum(tmp_path / "out" / "model_00002.pt")


def test_a_disk_without_room_for_the_checkpoints_is_refused_before_step_0(tmp_path, monkeypatch):
    """The preflight's estimate of a checkpoint (weights and AdamW's moments) is the file's tensors; the disk must
    hold the checkpoints the run keeps at once, the one being saved included, before the first step."""
    from training import preflight

    estimates, estimate = [], preflight.checkpoint_bytes
    monkeypatch.setattr(preflight, "checkpoint_bytes", lambda *a: estimates.append(estimate(*a)) or estimates[-1])
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    train_in_process(args(data, tmp_path / "room", max_steps=2, checkpoint_interval=0))
    size = (tmp_path / "room" / "model_00002.pt").stat().st_size
    assert 0 < size - estimates[0] < 2**16, (estimates, size)  # the rest: Adam's step counts, RNG, the zip's framing
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage._replace(free=3 * estimates[0]))
    # checkpoints at steps 2, 4, 6 and 8, three kept: four at once while the fourth replaces the first
    error = cli_error(args(data, tmp_path / "full", max_steps=8, checkpoint_interval=2, keep_checkpoints=3))
    assert error.startswith(f"error: --out-dir {tmp_path / 'full'}: ") and "the 4 new checkpoint(s)" in error, error
    assert "lower --keep-checkpoints" in error and not (tmp_path / "full" / "metrics.jsonl").exists()
    preflight.disk_room(tmp_path / "full", estimates[0], written=4, keep=2)()  # three fit
    with pytest.raises(errors.ConfigError, match="the 2 new checkpoint"):  # a resume: 2 of the 3 kept are there
        preflight.disk_room(tmp_path / "room", 2 * estimates[0], written=4, keep=2)()


def test_the_preflight_stops_every_rank_with_the_first_failing_ranks_error(monkeypatch):
    """Rank 0 checks first (a download then lands once), the others after it; every rank raises the lowest failing
    rank's error at once (the gather is faked here: this is the decision each rank takes from it)."""
    from training import preflight

    ran = []

    def fake_gather(verdicts):
        rounds = iter(verdicts)
        monkeypatch.setattr(preflight.distributed, "gather_objects", lambda problem, d: next(rounds))

    fake_gather([[("DataNotFound", "hellaswag_val.jsonl: no such file; pass --hellaswag-data"), None]])
    with pytest.raises(errors.DataNotFound, match=r"^rank 0: hellaswag_val\.jsonl: no such file"):
        preflight.resolve([lambda: ran.append("rank 1 checked")], Dist(rank=1, world_size=2))
    assert ran == []  # rank 0 failed first: rank 1 never checked

    def offline():
        raise errors.TokenizerError("cannot load tiktoken's gpt2 encoding")

    fake_gather([[None, None], [None, ("TokenizerError", "cannot load tiktoken's gpt2 encoding")]])
    with pytest.raises(errors.TokenizerError, match="^rank 1: cannot load"):
        preflight.resolve([lambda: ran.append("rank 0 checked")], Dist(rank=0, world_size=2))
    assert ran == ["rank 0 checked"]
    fake_gather([[None, None], [None, ("TokenizerError", "cannot load tiktoken's gpt2 encoding")]])
    with pytest.raises(errors.TokenizerError, match="^cannot load"):  # its own error: no rank named
        preflight.resolve([offline], Dist(rank=1, world_size=2))


def test_work_that_fails_on_one_rank_fails_on_every_rank_before_the_next_collective(monkeypatch):
    """HellaSwag's scoring on one GPU runs out of memory: the other ranks raise too, rather than wait in the
    all-reduce that follows for a rank that never comes (the all-reduce of the outcome is faked here)."""
    from training import distributed

    monkeypatch.setattr(distributed, "any_rank", lambda failed, d: True)  # the other rank's work raised
    with pytest.raises(RuntimeError, match="^this work failed on another rank"):
        distributed.before_collective(lambda: "scored", Dist(rank=0, world_size=2))

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):  # its own error, on the rank that failed
        distributed.before_collective(out_of_memory, Dist(rank=1, world_size=2))
    monkeypatch.setattr(distributed, "any_rank", lambda failed, d: failed)
    assert distributed.before_collective(lambda: "scored", Dist(rank=0, world_size=2)) == "scored"


@pytest.fixture(scope="module")
def failing_runs(tmp_path_factory):
    """One torchrun job of 2 gloo ranks for two tests (tests/run_in_turn.py: one start-up): a run whose rank 0
    cannot save (a directory where model_00004.pt goes), then in the same workers a run left training for
    test_a_stalled_rank_stops_the_run_and_is_named. Returns the job's directory, its process and the job's log as it
    was once the second run trained a step (both ranks had ended the first run)."""
    root = tmp_path_factory.mktemp("failing_runs")
    data = write_corpus(root / "data")
    (root / "save" / "model_00004.pt").mkdir(parents=True)
    failed_save = args(data, root / "save", checkpoint_interval=2)
    stalled = args(data, root / "stalled", max_steps=100000, checkpoint_interval=100000, eval_interval=100000,
                   dist_timeout=4)
    proc = torchrun(["+++", "train_gpt2.py", *failed_save, "---", "train_gpt2.py", *stalled], root / "job.log",
                    "--standalone", "--nproc_per_node", "2", script=ROOT / "tests" / "run_in_turn.py")
    try:
        steps = root / "stalled" / "log.txt"
        wait_for(lambda: " train " in (steps.read_text() if steps.exists() else ""), proc,
                 "a training step of the second run")
        yield root, proc, (root / "job.log").read_text()
    finally:
        if proc.poll() is None:  # the stalled test did not run: torchrun stops its workers on SIGTERM
            proc.terminate()
            proc.wait(timeout=120)


@pytest.mark.long
@pytest.mark.xdist_group("failing_runs")
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc (Linux)")
def test_a_failed_save_stops_every_rank_with_one_line(failing_runs):
    """Rank 0 cannot save; rank 1 learns it at once, not by a timeout (the run's default --dist-timeout would
    outlast the fixture's wait for the next run)."""
    root, _, log = failing_runs
    lines = log.splitlines()
    errors = sorted(line for line in lines if line.startswith("error: "))
    assert len(errors) == 2 and not [line for line in lines if line.startswith("[rank")], lines  # no worker traceback
    assert "model_00004.pt failed (Is a directory; " in errors[0] and "newest: model_00002.pt" in errors[0]
    assert errors[1].endswith("model_00004.pt failed on rank 0 (its log says why)")
    assert sorted(p.name for p in (root / "save").glob("model_*")) == [
        "model_00002.pt", "model_00002.pt.sha256", "model_00004.pt"]


@pytest.mark.long
@pytest.mark.xdist_group("failing_runs")
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc (Linux)")
def test_a_stalled_rank_stops_the_run_and_is_named(failing_runs):
    root, proc, _ = failing_runs
    log = root / "job.log"
    stalled = worker_pid(proc.pid, rank=1)
    os.kill(stalled, signal.SIGSTOP)
    started = time.time()
    try:
        wait_for(lambda: "error: step" in log.read_text(), proc, "rank 0's timeout line", seconds=120)
        took = time.time() - started
    finally:
        os.kill(stalled, signal.SIGKILL)  # a stopped process ignores torchrun's SIGTERM for 30 s
    assert proc.wait(timeout=120) != 0
    lines = [line for line in log.read_text().splitlines() if line.startswith("error: step")]
    assert len(lines) == 1, log.read_text()
    assert re.match(r"error: step \d+: rank 0 waited more than 4s \(--dist-timeout\) for the [a-z -]+[^;]*; "
                    r"rank 1 did not answer afterwards", lines[0]), lines[0]
    assert took < 60, took  # 4 s timeout + 4 s asking the store, not gloo's 30-minute default


def test_data_preparation_killed_and_rerun_gives_the_same_shards(fineweb, tmp_path):
    """kill -9 of data/fineweb.py mid-way (no cleanup runs), then the same command again: every file, manifest
    included, is byte-identical to an uninterrupted run's. The uninterrupted run and the rerun are fineweb.main in
    this process (the rerun may read only what the killed process left)."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}: " + "the quick brown fox jumps. " * (i % 7 + 1)})
                              + "\n" for i in range(1500)))
    options = ["--input", str(corpus), "--shard-size", "100", "--workers", "1", "--out"]
    fineweb.main(options + [str(tmp_path / "whole")])
    manifest = tmp_path / "killed" / "manifest.json"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "data" / "fineweb.py"), *options, str(tmp_path / "killed")],
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 20, proc, "20 shards")
    proc.kill()
    proc.wait()
    assert not json.loads(manifest.read_text())["finished"], "the kill came after the end: nothing was tested"
    fineweb.main(options + [str(tmp_path / "killed")])
    whole = {p.name: p.read_bytes() for p in (tmp_path / "whole").iterdir()}
    killed = {p.name: p.read_bytes() for p in (tmp_path / "killed").iterdir()}  # no temporary file left either
    assert len(whole) > 100 and killed.keys() == whole.keys()
    assert all(killed[name] == whole[name] for name in whole)


def test_checkpoints_of_earlier_versions_still_resume(tmp_path):
    """Their numpy RNG state is a pickled array: allow-listed, so a run in progress survives the upgrade."""
    import numpy as np

    np.random.seed(3)
    legacy = {**checkpoint.rng_state(), "numpy": np.random.get_state()}  # the array, as before
    expected = np.random.rand(3)
    torch.save({**tiny_state(2), "rng": [legacy]}, tmp_path / "model_00002.pt")  # no sidecar either
    ckpt = checkpoint.load_checkpoint(tmp_path / "model_00002.pt")
    assert isinstance(ckpt["rng"][0]["numpy"][1], np.ndarray)
    np.random.seed(4)
    checkpoint.set_rng_state(ckpt["rng"][0])
    assert np.array_equal(np.random.rand(3), expected)
    resaved = checkpoint.save_checkpoint({**ckpt, "rng": [checkpoint.rng_state()]}, tmp_path / "new", 2)
    assert torch.load(resaved, weights_only=True)["step"] == 2  # plain data now: no allow-list needed


def test_a_repeated_sigterm_still_saves_and_a_second_ctrl_c_aborts():
    """A preempted worker under torchrun gets SLURM's SIGTERM and then torchrun's: the second is the same request,
    so the run still finishes its step and saves; a second Ctrl-C at a terminal means "now"."""
    stop = GracefulStop()
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pytest.fail("the second SIGTERM aborted the run before its save")
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.close()
