"""CORE in the training loop (--core-bundle DIR [--core-max-per-task N]): eval/core.py's scorer on the model the loop
evaluates, at every evaluation step and at the end, its rows split over the ranks as eval/core.py splits them.

It logs the CORE score (the mean centered accuracy over the bundle's tasks, nanochat's) and its continuous
counterpart, the tasks' mean gold bits per byte (core_bpb: each task's mean over its items, averaged over the
tasks as CORE averages them), and every task's acc, centered accuracy and gold bits per byte in the eval record's
`core_tasks` (the sweep report's per-task signal-to-noise table reads them: analysis/downstream.py)."""
import time

import numpy as np

from data.tokenizer import gpt2_tokenizer
from errors import ConfigError, NanoactError
from eval.core import evaluate_core, load_bundle
from training.in_loop import InLoopEvaluation, Metric

CORE = Metric("core", "CORE (mean centered acc)", "centered acc")
# the continuous score of the same pass (eval/continuous.py): it moves where the accuracies sit at chance
CORE_BPB = Metric("core_bpb", "CORE gold bits/byte", "bits/byte", higher_is_better=False)
TASK_KEYS = ("acc", "centered", "bpb")  # what `core_tasks` keeps of each task


class Core(InLoopEvaluation):
    name = "core"
    metrics = (CORE, CORE_BPB)

    def __init__(self, trainer, ctx):
        super().__init__(trainer, ctx)
        self.tasks = None

    def inputs(self):
        """The bundle, read and checked before step 0, and the tokenizer it is scored with."""
        return [self.resolve] if self.cfg.eval.core_bundle else []

    def resolve(self):
        e, vocab_size = self.cfg.eval, self.cfg.model.vocab_size
        try:
            self.tasks = load_bundle(e.core_bundle, e.core_max_per_task or None)
            vocab = gpt2_tokenizer().n_vocab
        except NanoactError as error:
            raise type(error)(f"--core-bundle {e.core_bundle}: {error}; or train without CORE: --core-bundle ''") \
                from None
        if vocab_size < vocab:
            raise ConfigError(f"--core-bundle {e.core_bundle}: CORE is scored in GPT-2 tokens (ids up to "
                              f"{vocab - 1:,}) but the model's vocab_size is {vocab_size:,}; train on GPT-2 shards "
                              "with --vocab-size 50304, or --core-bundle ''")

    def due(self, step, last):
        return bool(self.cfg.eval.core_bundle)

    def run(self, step, last, model):
        d = self.ctx.dist
        t0 = time.time()
        result = evaluate_core(model, self.tasks, d.device, self.ctx.autocast, d)
        seconds = time.time() - t0
        tasks = {label: {k: r[k] for k in TASK_KEYS if k in r} for label, r in result["tasks"].items()}
        bpb = float(np.mean([r["bpb"] for r in tasks.values() if "bpb" in r]))
        return ({CORE.name: result["core"], CORE_BPB.name: bpb, "core_tasks": tasks, "core_seconds": seconds},
                f" | CORE {result['core']:.4f} bits/byte {bpb:.4f} ({seconds:.1f}s)")
