"""The commands README.md and docs/ print run: each one is read from the docs (tests/test_docs.py's commands():
code blocks and `backticked` spans) and started, so a command that no longer works fails here, not in a user's
hands. How each starts follows from what it needs (plan()):
    run        as printed, in a folder that holds tiny stand-ins for every path it reads (log/aglu, log/gelu,
               ../build-nanogpt/log, ...: fixture_tree), with HellaSwag's file in $NANOACT_CACHE
    dry-run    a command that trains (a trainer, or a TOML config named) takes minutes: --dry-run where it has one...
    help       ... else `--help`; so too a command for a GPU, torchrun, shell variables, absolute paths, or a path no
               stand-in holds (it starts and reads its command line)
tests/test_docs.py checks that the paths, modules and flags they name exist; this checks that they run."""
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import offline_gpt2_encoding, tiny_checkpoint, write_hellaswag, write_items_file
from forked_scripts import run_forked
from test_bench_scripts import TST2014, translation_runs
from test_compare import add_telemetry, llmc_log, nanogpt_log, our_run
from test_docs import ROOT, accepts, commands, invocations, our_file

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTPUT_FLAGS = ("-o", "--out", "--out-dir", "--output_path", "--prepare")  # what a command writes: no stand-in needed
PATH = re.compile(r"/|\.(pt|txt|json|jsonl|gz|en|de|toml|png)$")
# what most commands import, imported once (tests/forked_scripts.py): the sweeps' dry-runs are their imports
PRELOAD = ("torch", "torch._dynamo", "scipy.stats", "matplotlib.pyplot")
STEP = 19073  # the recipe's last checkpoint, which the docs name (log/aglu/model_19073.pt)


def current_table(text):
    """BENCHMARKS.md's opening table: each figure a user asks for with the command that reproduces it."""
    return text.split("\n## ", 1)[0]


def doc_commands():
    """{(target, args): the first doc that prints it} for every python command of ours in DOCS and in BENCHMARKS.md's
    opening table, pytest left out."""
    found = {}
    texts = [(doc, doc.read_text()) for doc in DOCS]
    texts.append((ROOT / "BENCHMARKS.md", current_table((ROOT / "BENCHMARKS.md").read_text())))
    for doc, text in texts:
        for command in commands(text):
            for target, args in invocations(command):
                if our_file(target) and target != "-m pytest":
                    found.setdefault((target, tuple(args)), doc.relative_to(ROOT).as_posix())
    return found


def inputs(args):
    """The arguments that name a path the command reads (not the value of an output flag)."""
    return [a for i, a in enumerate(args) if PATH.search(a) and not a.startswith("-")
            and not (i and args[i - 1] in OUTPUT_FLAGS)]


def trains(file):
    """A trainer: its command line is a training config's (training/config.run_cli)."""
    return "run_cli(" in file.read_text()


def plan(target, args, tree):
    """("run" | "dry-run" | "help", the arguments to start it with); tree: the folder of the stand-ins."""
    reads = inputs(args)
    if (any("$" in a or a == "..." or a.startswith("/") or "cuda" in a for a in args)
            or not all((tree / p).exists() for p in reads)):
        return "help", ["--help"]
    if trains(our_file(target)) or any(p.startswith("configs/") for p in reads):
        if accepts(our_file(target))("--dry-run"):
            return "dry-run", list(args) if "--dry-run" in args else [*args, "--dry-run"]
        return "help", ["--help"]
    return ("run", list(args)) if reads else ("help", ["--help"])


def gpt2_run(path, act, labels):
    """A tiny GPT-2 run as the recipe leaves it: logs with telemetry, its last checkpoint and that step's HellaSwag
    items (with these labels: those of the file eval/hellaswag.py then scores, in $NANOACT_CACHE)."""
    from eval.hellaswag_items import run_items_file

    shutil.copytree(tiny_checkpoint(path.parent / f"checkpoint_{act}", act=act, step=STEP).parent, path)
    add_telemetry(our_run(path, act=act))
    for items in (run_items_file(path, STEP), path / f"hellaswag_{STEP}_items.jsonl.gz"):  # the run's, hellaswag.py's
        write_items_file(items, labels, [(label + len(act)) % 4 for label in labels], ("completion", "lm_eval"), STEP)


def fixture_tree(root):
    """root/work, the folder the commands start in, with a stand-in for each path the docs' commands read that
    runs in seconds; configs/ is the project's."""
    work, cache = root / "work", root / "cache"
    cache.mkdir()
    hellaswag = write_hellaswag(cache / "hellaswag_val.jsonl", 8)
    labels = [json.loads(line)["label"] for line in hellaswag.read_text().splitlines()]
    for act in ("aglu", "gelu", "ft_aglu", "ft_gelu"):
        gpt2_run(work / "log" / act, act.removeprefix("ft_"), labels)
    nanogpt_log(root / "build-nanogpt" / "log")
    llmc_log(root / "llm.c" / "log124M")
    refs = ["The dog sees a ball.", "The cat drinks water today.", "A small house."]
    (work / "log" / "translation_6l").mkdir()
    (work / "log" / "translation_6l" / "translations_test_beam5.txt").write_text("\n".join(refs) + "\n")
    (work / "test.en").write_text("\n".join(refs) + "\n")
    (work / "runs" / "fs").mkdir(parents=True)
    translation_runs(work / "runs" / "fs", refs)
    (work / "runs" / "fs" / "nanoact_run").rename(work / "runs" / "fs" / "nanoact_postln")
    (work / "runs" / "fs" / "fairseq_run").rename(work / "runs" / "fs" / "fairseq")
    (root / TST2014).parent.mkdir(parents=True)
    (root / f"{TST2014}.en").write_text("\n".join(refs) + "\n")
    (work / "configs").symlink_to(ROOT / "configs")
    return work


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """{(target, args): (mode, Started)} of every doc command, one forked batch (tests/forked_scripts.py); the
    `--help` of a script once, however many commands fell back to it."""
    from data.tokenizer import TokenizerError
    try:
        offline_gpt2_encoding()  # sets TIKTOKEN_CACHE_DIR for the commands when ../shared holds the cache
    except TokenizerError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("docs")
    work = fixture_tree(root)
    planned = {key: plan(*key, work) for key in doc_commands()}
    runs = {}
    for (target, _), (mode, args) in planned.items():
        runs.setdefault((target, tuple(args)), (target if target.startswith("-m ") else str(ROOT / target), args))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NANOACT_CACHE", str(root / "cache"))
        done = run_forked(runs, work, preload=PRELOAD, limit=120)
    return {key: (mode, done[(key[0], tuple(args))]) for key, (mode, args) in planned.items()}


def test_each_way_of_starting_is_planned_for_the_docs(tmp_path):
    """The docs hold commands of each kind, and plan() tells them apart: a trainer's config is not trained here,
    a sweep's plan is dry-run, a run's stand-in is read, a GPU's command and an unknown path get --help."""
    work = fixture_tree(tmp_path)
    modes = {plan(*key, work)[0] for key in doc_commands()}
    assert modes == {"run", "dry-run", "help"}
    assert plan("train_gpt2.py", ["--config", "configs/gpt2_cpu_tiny.toml", "--act", "aglu"], work) == \
        ("help", ["--help"])
    assert plan("sample.py", ["log/aglu", "--num-samples", "2"], work) == ("run", ["log/aglu", "--num-samples", "2"])
    assert plan("sample.py", ["log/relu"], work)[0] == plan("sample.py", ["log/aglu", "--device", "cuda"], work)[0] \
        == "help"
    assert plan("sample.py", ["log/aglu", "--out", "new/samples.txt"], work)[0] == "run"  # an output: no stand-in


@pytest.mark.long
@pytest.mark.xdist_group("doc_commands")  # one worker starts them all, once
@pytest.mark.parametrize("key", sorted(doc_commands()), ids=lambda key: " ".join((key[0], *key[1]))[:80])
def test_doc_command_runs(key, started):
    mode, run = started[key]
    assert run.status == 0, f"{doc_commands()[key]}: python {key[0]} {' '.join(key[1])} ({mode})\n{run}"
    assert run.out.strip(), run
