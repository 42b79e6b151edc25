"""Fixtures shared by the evaluation tests: the real GPT-2 tokenizer (offline cache) and tiny checkpoints.

Also switches Triton's interpreter on when there is no GPU, so tests/test_kernels.py runs the kernels on
the CPU. It has to happen here (pytest_configure): triton reads TRITON_INTERPRET once, when it is first imported
(it decorates tl.sum, tl.sigmoid, ... then), and test modules collected earlier import it through torch._dynamo."""
import atexit
import dataclasses
import functools
import gc
import json
import os
import random
import sys
from pathlib import Path

import pytest

from two_rank_runs import two_rank_runs  # noqa: F401 (a fixture: defined once here, one job per worker)

# The subprocesses the tests start (trainers, torchrun workers, probes) run tiny models too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor proves the CPU's vector ISA (AVX512 here) by compiling probe programs with g++ before its first kernel:
# ~7 CPU-s per cold cache. The ISA it then uses is the one cpuinfo reports either way; a compiler that could not
# build it would fail the compiled tests loudly instead of falling back.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

SHARED = Path(__file__).resolve().parents[2] / "shared"
XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config):
    """Triton's interpreter where there is no GPU, before any test module is collected. Not in an xdist controller:
    it runs no test, and torch's import (~1.3 CPU-s) would delay the start of its workers.
    An xdist worker collects with the cyclic collector off (pytest_collection_finish turns it on): importing every
    test module (torch, dynamo, scipy, transformers, ...) grows the heap by most of what it will hold, and the full
    collections its allocations trigger on the way walked a heap that was all still in use."""
    if getattr(config.option, "numprocesses", None) and not XDIST_WORKER:
        return
    if XDIST_WORKER:
        gc.disable()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items):
    """Long tests (@pytest.mark.long: processes, compiles, training) first. pytest-xdist hands tests out in this
    order, so none of them starts near the end while the other worker has nothing left to do.

    A test in two xdist groups (a module's pytestmark and its own mark) is in neither for --dist loadgroup, but in a
    third, "A_B", which may go to the other worker: the session fixture both groups were made to share (the
    two_rank_runs torchrun job) would then run twice. Refused at collection, as is a test that uses that job
    outside its group (another worker would run the job again)."""
    for item in items:
        groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid}: in xdist groups {groups}; a test may share one group only")
        if "two_rank_runs" in getattr(item, "fixturenames", ()) and groups != ["two_rank_runs"]:
            raise pytest.UsageError(f"{item.nodeid}: uses the two_rank_runs job outside "
                                    '@pytest.mark.xdist_group("two_rank_runs"); mark it so that one worker runs the job')
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is faster and bit-reproducible. Two threads per test under pytest-xdist (one
    worker per core) spin against the other worker: test_tiny_model_learns_to_reverse took 8 CPU-s alone and
    42 CPU-s inside the suite when an earlier test had left 2 threads set."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def offline_gpt2_encoding():
    """tiktoken's gpt2 encoding from ../shared's offline cache (or a cache already configured); TokenizerError
    when there is neither."""
    cache = SHARED / "assets" / "tokenizer" / "tiktoken_cache"
    if "TIKTOKEN_CACHE_DIR" not in os.environ and cache.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    from data.tokenizer import gpt2_tokenizer
    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def gpt2_enc():
    """offline_gpt2_encoding(), or a skip that says why not."""
    from data.tokenizer import TokenizerError
    try:
        return offline_gpt2_encoding()
    except TokenizerError as e:
        pytest.skip(str(e))


def tiny_checkpoint(directory, act="gelu", seed=0, step=7, **overrides):
    """The path of a random tiny GPT-2 checkpoint written under directory/run_{act}_{seed}/.

    Weights are scaled up from GPT-2's init so the random model has confident, distinct predictions
    (at std 0.02 every ending scores almost the same and comparisons would be weak)."""
    import torch

    from training.checkpoint import save_checkpoint
    from model import GPT, GPTConfig

    cfg = GPTConfig(**{**dict(block_size=128, n_layer=2, n_head=2, n_embd=32, act=act), **overrides})
    torch.manual_seed(seed)
    model = GPT(cfg, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    state = {"kind": "gpt2", "model": model.state_dict(), "model_config": dataclasses.asdict(cfg),
             "config": {}, "step": step}
    return save_checkpoint(state, directory / f"run_{act}_{seed}", step)


@pytest.fixture
def make_checkpoint(tmp_path):
    """make_checkpoint(act="gelu", seed=0, step=7, **GPTConfig fields): tiny_checkpoint under tmp_path."""
    return functools.partial(tiny_checkpoint, tmp_path)


WORDS = ("the man woman dog ball kitchen slowly then picks up a knife and cuts onion runs across field "
         "water bottle camera smiles people crowd watch while she he they continues to paint wall").split()


def fake_item(rng, ind):
    """A HellaSwag-format record with the features lm-eval's preprocessing touches: WikiHow brackets,
    ' [title]', double spaces, a lower-case ctx_b to capitalize, trailing spaces, endings of varied length."""
    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    ctx_a = words(3, 25) + rng.choice(["", " [title] " + words(1, 4), " [step]  " + words(1, 5)])
    ctx_b = rng.choice(["", words(1, 6), "[substeps] " + words(1, 3)])
    endings = [words(1, 18) + rng.choice(["", ".", " [header] end", "  x "]) for _ in range(4)]
    return {"ind": ind, "activity_label": rng.choice(["Cooking", "Painting", "Home and Garden"]),
            "ctx_a": ctx_a, "ctx_b": ctx_b, "ctx": (ctx_a + " " + ctx_b).strip(), "endings": endings,
            "label": rng.randint(0, 3), "split": "val", "split_type": "indomain", "source_id": f"fake~{ind}"}


def write_hellaswag(path, n=12, seed=0):
    """A generated HellaSwag-format jsonl of n items at path."""
    rng = random.Random(seed)
    path.write_text("".join(json.dumps(fake_item(rng, i)) + "\n" for i in range(n)))
    return path


@pytest.fixture
def hellaswag_file(tmp_path):
    """write(n, seed, name) -> write_hellaswag under tmp_path."""
    return lambda n=12, seed=0, name="hellaswag_fake.jsonl": write_hellaswag(tmp_path / name, n, seed)


def write_items_file(path, labels, pred_norm, scorings=("completion",), step=5):
    """An items file (eval/hellaswag_items.py) at path whose acc_norm predictions are pred_norm, for every scoring
    named (acc: always ending 0)."""
    from eval import hellaswag_items

    records = []
    for i, (label, pred) in enumerate(zip(labels, pred_norm)):
        div = [1.0, 1.0, 1.0, 1.0]
        div[pred] = 100.0  # ll / div is highest for the predicted ending (-x/100 > -4)
        records.append({"i": i, "label": label, **{s: hellaswag_items.scoring_record([-4.0, -5.0, -6.0, -7.0], div)
                                                   for s in scorings}})
    return hellaswag_items.write(path, {"n": len(labels), "scorings": list(scorings), "step": step}, records)


@pytest.fixture
def write_items():
    """write(path, labels, pred_norm, scorings, step) -> write_items_file."""
    return write_items_file


def pytest_collection_finish():
    """An xdist worker holds ~800k objects once it has collected (torch, scipy, transformers, ...), and the tests make
    few reference cycles: Python's full collections walked them all, ~45 times a suite (11.5 CPU-s over the two
    workers of `-n auto` on 2 cores; 5.3 frozen, with full collections 10x rarer). Workers only: a frozen object is
    never freed, so the process leaves without the interpreter's teardown (pytest_sessionfinish); so are the few
    cycles the collection left as garbage, collected by none (pytest_configure)."""
    if XDIST_WORKER:
        gc.freeze()
        gc.set_threshold(700, 10, 100)  # the third: gen-1 collections per full one (default 10)
        gc.enable()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish():
    """An xdist worker's end, after it has sent its results: pytest's unraisable-exception check runs five full
    collections over the heap that torch, dynamo, transformers and Triton leave (~0.5 s each), then the interpreter's
    teardown collects it again (~2 s): ~4.5 s of the suite's wall time. One collection does the check's work (a
    __del__ that raises still reports); the survivors are frozen, so the check's collections skip them, and the
    worker leaves without the teardown, in which Triton's bindings would report the frozen objects as leaked."""
    if XDIST_WORKER:
        gc.collect()
        gc.freeze()
        atexit.register(_leave_without_teardown)


def _leave_without_teardown():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
