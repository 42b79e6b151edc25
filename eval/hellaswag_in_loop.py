"""HellaSwag in the training loop (--hellaswag-interval N): the same scorer as eval/hellaswag.py, on the model the
loop evaluates (compiled when the run compiles), every N steps at evaluation steps and at the end."""
import time
from dataclasses import replace

from data.tokenizer import gpt2_tokenizer
from errors import ConfigError, NanoactError
from eval import hellaswag_items
from eval.hellaswag import data_file, evaluate_model, load_items
from training.in_loop import InLoopEvaluation, Metric

ITEMS = 10042  # the validation set's items, scored when --hellaswag-limit is 0
# completion scoring (build-nanogpt's); acc_norm is the one plotted, under build-nanogpt's log.txt kind
ACC = Metric("hellaswag_acc", "HellaSwag acc", "acc", plotted=False)
ACC_NORM = Metric("hellaswag_acc_norm", "HellaSwag acc_norm", "acc_norm", log_kind="hella")
# the continuous score of the same pass (eval/continuous.py): it moves where accuracy sits at chance
BPB = Metric("hellaswag_bpb", "HellaSwag gold bits/byte", "bits/byte", higher_is_better=False)


class HellaSwag(InLoopEvaluation):
    name = "hellaswag"

    def __init__(self, trainer, ctx):
        super().__init__(trainer, ctx)
        e = self.cfg.eval
        self.metrics = (*(replace(m, items=e.hellaswag_limit or ITEMS) for m in (ACC, ACC_NORM)), BPB)
        self.path = None

    def inputs(self):
        """Its file and tokenizer, resolved before step 0 rather than at the first HellaSwag step."""
        return [self.resolve] if self.cfg.eval.hellaswag_interval else []

    def resolve(self):
        """The HellaSwag jsonl (--hellaswag-data, else the cached download, fetched now if absent), read and
        checked; the GPT-2 tokenizer it is scored with, and a model with a row for each of its tokens."""
        e, vocab_size = self.cfg.eval, self.cfg.model.vocab_size
        try:
            self.path = data_file(e.hellaswag_data or None, "--hellaswag-data")
            load_items(self.path, e.hellaswag_limit or None)
            vocab = gpt2_tokenizer().n_vocab
        except NanoactError as error:
            raise type(error)(f"--hellaswag-interval {e.hellaswag_interval}: {error}; or train without HellaSwag: "
                              "--hellaswag-interval 0") from None
        if vocab_size < vocab:
            raise ConfigError(f"--hellaswag-interval {e.hellaswag_interval}: HellaSwag is scored in GPT-2 tokens "
                              f"(ids up to {vocab - 1:,}) but the model's vocab_size is {vocab_size:,}; "
                              "train on GPT-2 shards with --vocab-size 50304, or --hellaswag-interval 0")

    def due(self, step, last):
        interval = self.cfg.eval.hellaswag_interval
        return bool(interval) and (step % interval == 0 or last)

    def run(self, step, last, model):
        d, e = self.ctx.dist, self.cfg.eval
        t0 = time.time()  # the whole call: the first one also tokenizes (then cached) and compiles
        # the final evaluation scores both ways and keeps every item's predictions for paired comparisons
        # (eval/compare_items.py, the sweep report); the ones before only the completion scoring they log
        items = hellaswag_items.run_items_file(self.cfg.run.out_dir, step, e.hellaswag_limit) if last else None
        hella = evaluate_model(model, device=d.device, data_path=self.path,
                               limit=e.hellaswag_limit or None, scoring="both" if last else "completion",
                               dist_info=d, autocast=self.ctx.autocast, progress=False, cache=True,
                               items_file=items, about={"scored_by": hellaswag_items.TRAINING,
                                                        "run": self.cfg.run.out_dir, "step": step,
                                                        "act": self.cfg.model.act})["completion"]
        seconds = time.time() - t0
        return ({ACC.name: hella["acc"], ACC_NORM.name: hella["acc_norm"], BPB.name: hella["bpb"],
                 "hellaswag_seconds": seconds},
                f" | hellaswag acc {hella['acc']:.4f} acc_norm {hella['acc_norm']:.4f} bits/byte {hella['bpb']:.4f} "
                f"({seconds:.1f}s)")
