"""--dist fsdp (training/fsdp.py) on 2 gloo ranks against DDP, from tests/two_rank_runs.py's one torchrun job:
tests/fsdp_vs_ddp.py's tiny models step by step and HellaSwag scoring, and the trainer's runs end to end (sharded
checkpoints, resume on 1 process; killed with kill -9 and resumed on 2 ranks: tests/test_faults.py)."""
import json
import pickle
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from model import GPT
from test_train_gpt2 import args, train_in_process, train_losses
from training.checkpoint import CorruptCheckpoint, load_checkpoint


def no_pickle(monkeypatch):
    """Every unpickling entry point raises: DCP's own reader pickle.loads its .metadata and its planner torch.loads
    non-tensor entries with weights_only=False (pickle.Unpickler); torch.load(weights_only=True) uses neither."""
    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint load unpickled")

    class Refused(pickle.Unpickler):  # a class: modules imported meanwhile may subclass it
        __init__ = refuse

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", Refused)


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
def test_fsdp_trains_as_ddp_and_resumes_on_two_ranks_and_on_one(two_rank_runs, tmp_path, monkeypatch):
    # step by step, gelu, aglu, nswish and swiglu under sp and completep: the same initial weights (the sharded
    # build on the meta device), losses and clipped norms of steps of 2 accumulated micro-batches, every
    # gradient after the first step (the tied embedding, AGLU's kappa and lam), every weight and buffer (NSwish's
    # running statistics) at the end; a 67-row tied embedding split 34 + 33 over the ranks moves in every row
    cases = json.loads((two_rank_runs / "fsdp_vs_ddp.json").read_text())
    hellaswag, hsdp = cases.pop("hellaswag", None), cases.pop("hsdp")
    assert len(cases) == 8
    for name, case in cases.items():
        assert case["sharded"] and case["embedding_shard_rows"] == 34, name
        assert case["init"]["gap"] == 0, (name, case["init"])
        assert case["loss"] < 1e-5 and case["norm"] < 1e-5, (name, case)
        assert case["grad"]["gap"] < 1e-5 and case["end"]["gap"] < 1e-5, (name, case["grad"], case["end"])
        assert case["rows_unmoved"] == 0 and case["rows"] == 67, name
    names = cases["aglu/sp"]["grad"]["names"]
    assert {"grad:transformer.wte.weight", "grad:transformer.h.1.mlp.act.kappa", "grad:transformer.h.1.mlp.act.lam"} \
        <= set(names)
    assert "buffer:transformer.h.0.mlp.act.running_rho" in cases["nswish/completep"]["end"]["names"]
    assert "grad:transformer.h.0.mlp.c_up.weight" in cases["swiglu/sp"]["grad"]["names"]
    # --dist hsdp, 2 replicas (2-D mesh): DDP's step too, every rank holding all 67 rows
    assert hsdp["sharded"] and hsdp["embedding_shard_rows"] == 67 and hsdp["rows_unmoved"] == 0
    assert hsdp["init"]["gap"] == 0 and hsdp["loss"] < 1e-5 and hsdp["norm"] < 1e-5
    assert hsdp["grad"]["gap"] < 1e-5 and hsdp["end"]["gap"] < 1e-5

    # the in-loop HellaSwag's scorer on the same weights sharded: DDP's scores (where the GPT-2 tokenizer is there)
    if hellaswag is not None:
        for scoring, ddp_scores in hellaswag["ddp"].items():
            ours = hellaswag["fsdp"][scoring]
            assert (ours["correct"], ours["correct_norm"], ours["n"]) == \
                (ddp_scores["correct"], ddp_scores["correct_norm"], 11)
            assert abs(ours["bpb"] - ddp_scores["bpb"]) < 1e-6 and ours["forwards"] == ddp_scores["forwards"]

    # the trainer: FSDP's run equals DDP's ("plain"); its checkpoints are sharded (each rank's file, a JSON index,
    # no DCP .metadata), read without unpickling by every reader of checkpoints (eval/hellaswag.py, sample.py, the
    # lm-eval class, the export: load_checkpoint, GPT.from_checkpoint), the whole weights in one process
    fsdp, ddp = train_losses(two_rank_runs / "fsdp"), train_losses(two_rank_runs / "plain")
    np.testing.assert_allclose(fsdp[0], ddp[0], rtol=0, atol=1e-5)
    assert len(fsdp[1]) == 1 and abs(fsdp[1][0] - ddp[1][-1]) < 1e-5  # the val loss at the end
    sharded = two_rank_runs / "fsdp" / "model_00008.dcp"
    assert sorted(p.name for p in sharded.iterdir()) == ["__0_0.distcp", "__1_0.distcp", "index.json", "state.pt"]
    with monkeypatch.context() as patched:
        no_pickle(patched)
        ours = load_checkpoint(two_rank_runs / "fsdp")
    theirs = load_checkpoint(two_rank_runs / "plain")
    assert ours["path"] == str(sharded) and ours["world_size"] == 2
    assert ours["model"].keys() == theirs["model"].keys()
    x = torch.arange(16)[None] % 64
    logits = [GPT.from_checkpoint(c)(x)[0] for c in (ours, theirs)]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)

    # a damaged shard is found before anything is loaded
    damaged = shutil.copytree(sharded, tmp_path / "damaged.dcp")
    with open(damaged / "__1_0.distcp", "r+b") as f:
        f.seek(-9, 2)
        f.write(b"x")
    with pytest.raises(CorruptCheckpoint, match="__1_0.distcp's sha256"):
        load_checkpoint(damaged)

    # on 1 process, the change declared: the same weights, optimizer state and data position go on, resharded by
    # DCP from the 2 ranks' files, without unpickling
    shutil.copytree(two_rank_runs / "fsdp" / "model_00004.dcp", tmp_path / "one" / "model_00004.dcp")
    with monkeypatch.context() as patched:
        no_pickle(patched)
        train_in_process(args(two_rank_runs / "gpt_data", tmp_path / "one", resume="true",
                              resume_changes="world_size,dist", dist="ddp"))
    one = train_losses(tmp_path / "one")
    np.testing.assert_allclose(one[0], fsdp[0][4:], rtol=0, atol=1e-5)
    run = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 4, "kind": "resume"}.items() <= run[0].items()
    assert run[0]["changes"]["world_size"] == {"from": 2, "to": 1}


def test_memory_estimate_and_the_refusal_of_a_run_that_cannot_fit():
    """GPT-2 XL (1.5B) on 8 GPUs of 80 GB: DDP's 16 bytes a parameter and more do not fit, FSDP's shards do; the
    refusal says so in one line, with what would fit."""
    from train_gpt2 import TrainConfig, memory_estimates, memory_shape
    from training import memory
    from training.config import load_config

    cfg = load_config(TrainConfig, ["--config", "configs/gpt2_xl.toml"])
    shape = memory_shape(cfg.model)
    assert 1.5e9 < shape.params < 1.6e9
    small = replace(cfg.model, n_layer=3, n_embd=64, n_head=2, act="swiglu")  # counted as 1 layer and 2 more
    with torch.device("meta"):
        assert memory_shape(small).params == sum(p.numel() for p in GPT(small, seed=0).parameters())
    both = memory_estimates(cfg, 8)  # bfloat16: the config's dtype is auto
    ddp, fsdp, n = both["ddp"], both["fsdp"], shape.params
    assert ddp.params == 4 * n and ddp.optimizer == 8 * n and fsdp.optimizer == 8 * n / 8 and fsdp.gathered > 0
    assert fsdp.total < 80e9 < ddp.total  # an 80 GB card
    micro = (cfg.optim.batch_size, cfg.optim.seq_len)
    line = memory.refusal(shape, *micro, "ddp", 8, "bfloat16", False, 0, 80e9, "an 80 GB GPU")
    assert "\n" not in line and "per GPU under --dist ddp on 8 ranks" in line and "--dist fsdp needs" in line
    assert memory.refusal(shape, *micro, "fsdp", 8, "bfloat16", False, 0, 80e9, "an 80 GB GPU") is None
    checkpointed = memory.estimate(shape, *micro, "fsdp", 8, "bfloat16", checkpointing=True)
    assert checkpointed.activations < fsdp.activations / 2


# beside the test above, which imports torch.distributed.checkpoint too (a CPU-second) in the worker of that group
@pytest.mark.xdist_group("two_rank_runs")
def test_a_sharded_checkpoint_is_atomic_verified_and_data_only(tmp_path, monkeypatch):
    """training/sharded_checkpoint.py in one process (DCP needs no process group for it): a save that fails leaves
    neither its directory nor its temporary one; a damaged index is skipped for the newest checkpoint that verifies;
    --keep-checkpoints removes old directories; every tensor reads back bit for bit, with no unpickling."""
    from errors import CheckpointError
    from training.checkpoint import list_checkpoints, newest_good_checkpoint, save_training_checkpoint
    from training.distributed import Dist

    class Loader:
        def state_dict(self):
            return {"position": 7}

    d = Dist()
    weights = {"w": torch.randn(5, 3), "b": torch.arange(4, dtype=torch.bfloat16)}
    optimizer = {"state": {"w": {"exp_avg": torch.randn(5, 3), "step": torch.tensor(2.0)}},
                 "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["w", "b"]}]}

    def save(step, model, keep=None):
        state = {"kind": "gpt2", "model": model, "model_config": {}, "config": {}, "optimizer": optimizer}
        return save_training_checkpoint(state, Loader(), d, tmp_path, step, keep, sharded=True)

    for step in (1, 2):
        save(step, weights)
    with pytest.raises(CheckpointError, match="model_00003.dcp failed .*not a tensor") as error:
        save(3, {**weights, "note": "text"})  # non-tensor bytes would be unpickled on load: refused
    assert "\n" not in str(error.value) and [p.name for p in tmp_path.iterdir()] == ["model_00001.dcp",
                                                                                    "model_00002.dcp"]
    (tmp_path / "model_00002.dcp" / "index.json").write_text("{")
    with monkeypatch.context() as patched:
        no_pickle(patched)
        ckpt, skipped = newest_good_checkpoint(tmp_path, "gpt2", d)
        read = load_checkpoint(tmp_path / "model_00001.dcp")
    assert ckpt["step"] == 1 and "model_00002.dcp: corrupt or incomplete" in skipped[0]
    assert ckpt["loader"] == [{"position": 7}] and ckpt["param_groups"] == optimizer["param_groups"]
    model = {"w": torch.zeros(5, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}
    state = {"w": {"exp_avg": torch.zeros(5, 3), "step": torch.tensor(0.0)}}
    ckpt["shards"].read_into({"model": model, "optimizer": {"state": state}})
    for name, value in weights.items():
        assert torch.equal(model[name], value) and torch.equal(read["model"][name], value), name
    assert torch.equal(state["w"]["exp_avg"], optimizer["state"]["w"]["exp_avg"]) and state["w"]["step"] == 2
    save(4, weights, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["model_00004.dcp"]
