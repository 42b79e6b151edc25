"""Every bench/ script runs: each started as `python bench/SCRIPT.py` with its smallest meaningful arguments on the
CPU (toy sizes, one round), so none rots between merges unnoticed (bench/translation_compile.py did: nothing ran it
after Transformer's seed became a required argument). Each must exit 0, print its table or JSON, and print nothing
at exit (bench/contender_memory.py ended with ~80 lines of "nanobind: leaked ..." from Triton)."""
import json
import re
from pathlib import Path

import pytest

from conftest import offline_gpt2_encoding, write_hellaswag
from data.tokenizer import TokenizerError
from forked_scripts import run_forked
from test_parallel_data import write_corpus

ROOT = Path(__file__).resolve().parents[1]
TST2014 = "shared/assets/iwslt/iwslt17_dev_test/IWSLT17.TED.tst2014.de-en"  # under the fixture's root, as ../shared
TINY_GPT = '{"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "block_size": 16}'
# script -> (its arguments, a pattern its stdout holds: the table's or the JSON's). {root}: the fixture's folder.
RUNS = {
    "activation_speed": (["--device", "cpu", "--acts", "gelu", "--rows", "8", "--rounds", "1", "--warmup", "1",
                          "--backend", "eager"],
                         r"\ngelu +[\d.]+ \(1\.00\)(.|\n)*\ncpu: the fused MLP \(activations/fused_mlp\.py, Triton\) runs only on a GPU"),
    "checkpoint_io": (["--smoke", "--rounds", "1", "--dir", "{root}"], r"\nread_checkpoint_file +[\d.]+ s"),
    "core_nanochat": ([], r"\nlm0 +language_modeling +6 +[\d.]+\nCORE ours -?[\d.]+; nanochat not run"),
    "coord_check": (["--smoke", "--params", "completep", "--out", "{root}/coord_check"],
                    r"(?m)^completep: max/min over widths 32-64 and depths 2-4: \|x\| [\d.]+x"),
    "contender_memory": (["--acts", "gelu,aglu", "--batch-size", "2"], r"\naglu .*\nalive after the run: 0\.00 MiB"),
    "downstream_coverage": (["--sims", "10", "--items", "20", "--truth-draws", "1000"],
                            r"\nbinary, items dominate +[\d.]+ \[[\d.]+, [\d.]+\] +[\d.]+"),
    "generation": (["--device", "cpu", "--n-layer", "1", "--n-embd", "32", "--prompt-tokens", "4", "--new-tokens",
                    "4", "--rounds", "1"], r'\n\{"device": "cpu".*"same_tokens": true'),
    "hellaswag": (["--limit", "4", "--n-layer", "1", "--n-embd", "32", "--modes", "eager", "--device", "cpu",
                   "--data", "{root}/hellaswag.jsonl"], r'\neager \{.*"completion": \{"acc"'),
    "hellaswag_items": (["--items", "40"], r'"items": 40,'),
    "kernel_decision": (["--families", "aglu"], r"aglu at 64x256 float32: empty cache [\d.]+ s"),
    "kernel_fast_math": (["--points", "1000"],
                         r"\naglu kappa 1, lam 0\.0001, self-check: out [\d.]+ / [\d.]+ / [\d.]+, grad_z"),
    "kernel_instructions": (["80", "--kernels", "_apa_kernel", "--dtypes", "fp32"],
                            r"\nsm_80 fp32 _apa_kernel\[backward\] +[\d.]+"),
    "lr_design": (["--smoke", "--sims", "4", "--reports", "1", "--report-sims", "2", "--curve-free-sims", "2"],
                  r"horizon, 6 lr seed\(s\), .*: family_wise [\d.]+ \["),
    "memory_estimate": (["--shape", TINY_GPT, "--batch-size", "2"],
                        r"(?m)^rank 0/1 gelu .* measured peak [\d,]+ MiB, estimate [\d,]+ MiB \(.*\), ratio [\d.]+\n"),
    "lr_transfer": (["--smoke", "--out", "{root}/lr_transfer"],
                    r"\n\| width \| gelu \| completep \| w32 4\.00e-03, w64 4\.00e-03, w128 4\.00e-03 \| 1\.00x \|"),
    "loss_chunk_precision": (["--rows", "64", "--vocab", "64", "--dim", "8", "--chunks", "2"],
                             r"\nchunked +relative error: hidden [\d.e+-]+, weight"),
    "readme_ratio": (["--dry-run"], r"tests \(cold caches\): .* -m pytest .*\njob: shards: .*\njob: run: .*train_gpt2"),
    "scaling_coverage": (["--sims", "10"], r"coverage [\d.]+ \["),
    "startup": (["--shards", "1,2", "--tokens", "1e4", "--rounds", "1", "--seq-len", "16", "--dir", "{root}"],
                r"\n +2 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+\n"),
    "torch_matrix": (["2.11.0", "--dry-run", "--venvs", "{root}/venvs"], r"\nsuite +PYTHONPATH=.* -m pytest "),
    "train_step": (["--acts", 'reference,gelu{"pos_emb": "rope"},gelu{"fused_mlp": true}', "--shape", TINY_GPT,
                    "--batch-size", "2", "--seq-len", "16", "--steps", "1", "--rounds", "1", "--warmup", "0",
                    "--no-peak"],
                   r"gelu\{\"fused_mlp\": true\}: not run, the fused MLP \(Triton\) runs only on a GPU \(cpu here\)"
                   r"(.|\n)*\nreference .* 1\.000 .*\ngelu\{\"pos_emb\": \"rope\"\} "),
    "translation_batches": (["--train-prefix", "{root}/corpus/train", "--vocab", "64", "--epochs", "1", "--spm-dir",
                             "{root}/spm_batches"], r"\n\| 8 \| \d+ \| \d+ \| [\d.]+% \|"),
    "translation_compile": (["--train-prefix", "{root}/corpus/train", "--vocab", "64", "--layers", "1", "--rows", "2",
                             "--length", "8", "--ways", "layers_dynamic", "--steps", "1", "--backend", "eager",
                             "--spm-dir", "{root}/spm_compile"],
                            r"\n\| layers_dynamic \| \d+ \| \d+ \| 2 \| 0 \|\n(.|\n)*\n\| layers_dynamic \| [\d.]+ \|"),
    "translation_fairseq": (["--report", "{root}/nanoact_run", "{root}/fairseq_run", "--test-sentences", "3"],
                            r"\n\| nanoact \| postln \| 2\.500 @10 \| 100\.00 / 100\.00 \| 1\.00 / 1\.00 \|"
                            r"\n\| fairseq \| post-LN \| 1\.386 @10 \| 100\.00 / 100\.00 \|"),
    "translation_init_loss": (["--d-model", "16", "--layers", "1", "--vocab", "50", "--batch", "2", "--length", "4"],
                              r"\n\| deepnorm \| tied \| torchscale \| [\d.]+ \|"),
}
# the scripts that import torch._dynamo (torch.compile, or torch.optim's first optimizer): started last, after the
# batch's parent has imported it (tests/forked_scripts.py's `later`)
DYNAMO = {"activation_speed", "checkpoint_io", "contender_memory", "coord_check", "memory_estimate", "train_step",
          "translation_compile"}
# scripts another test starts as `python bench/SCRIPT.py` already, with arguments that run all of it
STARTED_BY = {"gpu_check": "tests/test_gpu_check.py"}
GPT2_BPE = {"hellaswag", "core_nanochat"}  # the scripts that tokenize with GPT-2's BPE: tiktoken online, or ../shared's offline cache
LEAK = re.compile(r"nanobind: leaked|leaked (type|function|instance)")


def scripts():
    """bench/'s scripts: its files that run as __main__ (not the modules they share, such as device_options.py)."""
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def translation_runs(root, refs):
    """A nanoact and a fairseq run directory, as bench/translation_fairseq.py --report reads them, that translated
    the references exactly."""
    nanoact, fairseq = root / "nanoact_run", root / "fairseq_run"
    nanoact.mkdir()
    fairseq.mkdir()
    (nanoact / "metrics.jsonl").write_text(json.dumps({"step": 0, "val_loss": 9.0}) + "\n"
                                           + json.dumps({"step": 10, "val_loss": 2.5}) + "\n")
    for name in ("beam5", "greedy"):
        (nanoact / f"translations_test_{name}.txt").write_text("\n".join(refs) + "\n")
    (nanoact / "run.json").write_text(json.dumps({"config": {"model": {"norm": "postln"}}}))
    (fairseq / "train.log").write_text("epoch 001 | valid on 'valid' subset | loss 2.1 | nll_loss 2.0 | ppl 4 | "
                                       "num_updates 10\n")
    for beam in (5, 1):
        lines = "".join(f"D-{i}\t-0.5\t{ref}\n" for i, ref in enumerate(refs))
        (fairseq / f"generate_beam{beam}.txt").write_text(lines)


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """Every script of RUNS started once, in one forked batch (tests/forked_scripts.py), from a folder whose parent
    holds the fixtures: a parallel corpus, a HellaSwag file, translation runs and ../shared's test references."""
    root = tmp_path_factory.mktemp("bench")
    write_corpus(root / "corpus", n_train=60)
    write_hellaswag(root / "hellaswag.jsonl", 8)
    refs = ["The dog sees a ball.", "The cat drinks water today.", "A small house."]
    (root / TST2014).parent.mkdir(parents=True)
    Path(root / f"{TST2014}.en").write_text("\n".join(refs) + "\n")
    translation_runs(root, refs)
    cwd = root / "work"
    cwd.mkdir()
    try:
        offline_gpt2_encoding()
        tokenizer = True
    except TokenizerError:
        tokenizer = False
    runs = {name: (str(ROOT / "bench" / f"{name}.py"), [a.replace("{root}", str(root)) for a in args])
            for name, (args, _) in RUNS.items() if tokenizer or name not in GPT2_BPE}
    # Triton's nanobind bindings report leaks at the interpreter's exit: a script that imported it ends there.
    # The statistics and plotting scripts' imports loaded once; torch._dynamo (which imports triton) once the
    # others have run, so that they end as before
    return run_forked(runs, cwd, preload=("torch", "scipy.stats", "matplotlib.pyplot"), limit=240, finalize="triton",
                      later=(("torch._dynamo",), DYNAMO))


def test_every_script_has_a_run():
    assert scripts() == sorted([*RUNS, *STARTED_BY])
    for script, test in STARTED_BY.items():
        assert f"bench/{script}.py" in (ROOT / test).read_text(), (script, test)


@pytest.mark.long
@pytest.mark.xdist_group("bench_scripts")  # one worker starts them all, once
@pytest.mark.parametrize("script", sorted(RUNS))
def test_script_runs_and_prints_its_results(script, started):
    if script not in started:
        pytest.skip(f"bench/{script}.py needs GPT-2's BPE: no tiktoken cache (TIKTOKEN_CACHE_DIR) and no ../shared")
    run = started[script]
    assert run.status == 0, run
    assert re.search(RUNS[script][1], run.out), run
    assert not LEAK.search(run.err), run
