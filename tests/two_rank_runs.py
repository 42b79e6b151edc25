"""The runs of 2 gloo processes that tests compare with, trained in turn by one torchrun job
(tests/run_in_turn.py): a job's start-up (its agent, and each worker's torch and dynamo imports) costs more CPU
than a tiny run. Tests that use the `two_rank_runs` fixture share the xdist group "two_rank_runs", so that one
pytest-xdist worker trains them."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GPT_RUNS = {  # run directory -> train_gpt2.py's arguments over test_train_gpt2.args: B=4 on each rank
    "plain": {},
    # the chunked loss, and an SDPA backend (a no-op on CPU); eager: a compiled pair of runs costs ~2 min here
    "speed-options": dict(loss_chunks=3, attention_backend="cudnn,flash"),
    # tests/test_faults.py's uninterrupted run: dropout, so that every rank's RNG state must resume too
    "elastic": dict(max_steps=40, eval_interval=20, checkpoint_interval=2, dropout=0.1, auto_resume="true"),
}
# tests/test_train_translation.py's step on 2 ranks, 1 batch each: train_translation.py's arguments over that
# file's `args`, and the run directory
TRANSLATION_RUN = ("--max-steps", "3", "--eval-interval", "3", "--test-at-end", "false", "--dropout", "0",
                   "--act-dropout", "0", "--act", "swish", "--act-kwargs", "{}", "--plain-top-k", "0",
                   "--max-tokens", "800", "--total-max-tokens", "1600")


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory):
    """The job's directory: gpt_data/ and translation_data/ (the corpora), spm/ (the sentencepiece model the
    translation run trained), a run directory per GPT_RUNS entry, translation/, and job.log (its stdout)."""
    # the test files that use this fixture import it: their helpers are imported here, when it runs
    from test_parallel_data import write_corpus as write_translation_corpus
    from test_train_gpt2 import args, run_trainer, write_corpus
    from test_train_translation import args as translation_args

    root = tmp_path_factory.mktemp("two_rank_runs")
    gpt_data = write_corpus(root / "gpt_data")
    commands = [["train_gpt2.py", *args(gpt_data, root / name, **extra)] for name, extra in GPT_RUNS.items()]
    commands.append(["train_translation.py", *translation_args(write_translation_corpus(root / "translation_data"),
                                                               root / "translation", root / "spm", *TRANSLATION_RUN)])
    job = run_trainer(sum((["---", *c] for c in commands), [])[1:], nproc=2, script=ROOT / "tests" / "run_in_turn.py")
    (root / "job.log").write_text(job.stdout)
    return root
