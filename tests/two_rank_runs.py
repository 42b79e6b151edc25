"""The runs of 2 gloo processes that tests compare with one process (GPT-2 and translation training, HellaSwag
scoring), and the kernels' "auto" decision on 2 ranks (tests/selfcheck_ranks.py), made in turn by one torchrun job
(tests/run_in_turn.py): a job's start-up (its agent, and each worker's torch and dynamo imports) costs more CPU
than a tiny run. Tests that use the `two_rank_runs` fixture (tests/conftest.py) share the xdist group "two_rank_runs", so that one pytest-xdist worker runs the job."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GPT_RUNS = {  # run directory -> train_gpt2.py's arguments over test_train_gpt2.args: B=4 on each rank
    "plain": {},
    # the chunked loss, and an SDPA backend (a no-op on CPU); eager: a compiled pair of runs costs ~2 min here
    "speed-options": dict(loss_chunks=3, attention_backend="cudnn,flash"),
    # tests/test_faults.py's uninterrupted run, sharded (FSDP2), with dropout
    "elastic": dict(dist="fsdp", max_steps=20, eval_interval=10, checkpoint_interval=2, dropout=0.1,
                    auto_resume="true"),
    # dropout and NSwish's running statistics: the same noise and statistics as 1 process accumulating 2 batches;
    # resumed from its step 4 by the job's last GPT-2 run (NOISE_RESUMED)
    "noise": dict(dropout=0.1, act="nswish"),
    # tests/test_fsdp.py: "plain" sharded (FSDP2), evaluated at the end only
    "fsdp": dict(dist="fsdp", eval_interval=0),
}
NOISE_RESUMED = "noise-resumed"  # "noise" resumed from its step-4 checkpoint by the next run of the job
# tests/test_train_translation.py's step on 2 ranks, 1 batch each: train_translation.py's arguments over that
# file's `args` (dropout, and NSwish with running statistics), and the run directory
TRANSLATION_RUN = ("--max-steps", "3", "--eval-interval", "3", "--test-at-end", "false", "--act-kwargs", "{}",
                   "--plain-top-k", "0", "--max-tokens", "800", "--total-max-tokens", "1600")


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory):
    """The job's directory: gpt_data/ and translation_data/ (the corpora), spm/ (the sentencepiece model the
    translation run trained), a run directory per GPT_RUNS entry and noise-resumed/, fsdp_vs_ddp.json
    (tests/fsdp_vs_ddp.py's), translation/, job.log (its stdout), selfcheck.RANK.json (tests/selfcheck_ranks.py's)
    where Triton's interpreter runs the kernels, and with the GPT-2 tokenizer eval/hellaswag.py's hellaswag.json, of
    the checkpoint in run_gelu_0/ on hellaswag.jsonl (fsdp_vs_ddp.json then has HellaSwag scores too), and
    eval/core.py's core.json of that checkpoint on core_bundle/ (bench/core_nanochat.py's tiny bundle)."""
    # imported when it runs: conftest.py imports this module, and the test files import its constants
    from bench.core_nanochat import write_tiny_bundle
    from conftest import offline_gpt2_encoding, tiny_checkpoint, write_hellaswag
    from data.tokenizer import TokenizerError
    from test_parallel_data import write_corpus as write_translation_corpus
    from test_train_gpt2 import args, run_trainer, write_corpus
    from test_train_translation import args as translation_args

    root = tmp_path_factory.mktemp("two_rank_runs")
    gpt_data = write_corpus(root / "gpt_data")
    commands = [["train_gpt2.py", *args(gpt_data, root / name, **extra)] for name, extra in GPT_RUNS.items()]
    commands += [["tests/copy_checkpoint.py", str(root / "noise"), "4", str(root / NOISE_RESUMED)],
                 ["train_gpt2.py", *args(gpt_data, root / NOISE_RESUMED, **GPT_RUNS["noise"], resume="true")]]
    commands.append(["train_translation.py", *translation_args(write_translation_corpus(root / "translation_data"),
                                                               root / "translation", root / "spm", *TRANSLATION_RUN)])
    fsdp_vs_ddp = ["tests/fsdp_vs_ddp.py", str(root / "fsdp_vs_ddp.json")]
    # tests/test_hellaswag.py's and test_core.py's runs and fsdp_vs_ddp's HellaSwag, where the GPT-2 tokenizer is at
    # hand (those tests skip otherwise)
    try:
        offline_gpt2_encoding()
        checkpoint = str(tiny_checkpoint(root))
        hellaswag = str(write_hellaswag(root / "hellaswag.jsonl", n=11))
        commands.append(["eval/hellaswag.py", checkpoint, "--data", hellaswag, "--device", "cpu", "--batch-items", "2",
                         "--out", str(root / "hellaswag.json")])
        commands.append(["eval/core.py", checkpoint, "--bundle", str(write_tiny_bundle(root / "core_bundle")),
                         "--max-per-task", "4", "--device", "cpu", "--batch-rows", "3",
                         "--out", str(root / "core.json")])
        fsdp_vs_ddp.append(hellaswag)
    except TokenizerError:
        pass
    commands.append(fsdp_vs_ddp)
    if importlib.util.find_spec("triton") and os.environ.get("TRITON_INTERPRET") == "1":  # test_selfcheck.py's
        commands.append(["tests/selfcheck_ranks.py", str(root / "selfcheck")])
    job = run_trainer(sum((["---", *c] for c in commands), [])[1:], nproc=2, script=ROOT / "tests" / "run_in_turn.py",
                      env={"NANOACT_CACHE": str(root / "nanoact_cache")})
    (root / "job.log").write_text(job.stdout)
    return root
