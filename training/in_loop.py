"""In-loop evaluations: the contract between an evaluation the loop runs beside the val loss (HellaSwag, the
translation trainer's valid BLEU) and the trainer that declares it, and what it tells the readers.

A trainer lists its in-loop evaluations in its `in_loop` tuple (one entry each); the loop builds each after the
trainer's build, as cls(trainer, ctx), so that it can take what build made (a tokenizer, the validation text).
An evaluation is one file (eval/hellaswag_in_loop.py, eval/bleu_in_loop.py) that says:

    name                             its part in the stdout line and in a failure record ("hellaswag")
    metrics                          its Metrics: each number named once, with how the readers show it
    inputs() -> checks               what it reads, checked before step 0 (training/preflight.py)
    due(step, last) -> bool          whether it runs at this evaluation step
    run(step, last, model) -> (fields, text)   its metrics.jsonl fields and the stdout text after the val loss

The loop adds its fields to the step's eval record, its plotted metrics to log.txt, and keeps the rest of the
evaluation when it raises (training/loop.py, `Evaluation.attempt`). run.json records every declared Metric, so
analysis/ shows any metric of any run without knowing its name.
"""
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Metric:
    """One number an in-loop evaluation records, and how the readers (analysis/) show it."""
    name: str  # the one spelling: the metrics.jsonl field, the readers' series and column key, the sweep's metric
    label: str  # the column header, the plot title, the sweep report's name for it
    unit: str  # what a difference of it counts, in the sweep report's power sentences ("BLEU", "acc_norm")
    fmt: str = ".4f"  # format() spec of a value in tables
    higher_is_better: bool = True
    # a curve in analysis.compare's figure, a log.txt line, and one of the sweep's paired claims; else a column only
    plotted: bool = True
    items: int | None = None  # a proportion of this many items: tables show % with its 95% Wilson interval
    log_kind: str | None = None  # its log.txt kind where that is not its name (build-nanogpt's `hella`)

    def record(self):
        """What run.json keeps of it."""
        return {key: value for key, value in asdict(self).items() if value is not None}


class InLoopEvaluation:
    name = None
    metrics = ()

    def __init__(self, trainer, ctx):
        """Called after the trainer's build: `trainer` holds its config (trainer.cfg) and what build kept, `ctx` is
        the loop's Context (ranks, device, autocast)."""
        self.cfg, self.ctx = trainer.cfg, ctx

    def inputs(self):
        """Checks (callables raising a NanoactError) of what it reads, run on every rank before step 0."""
        return []

    def due(self, step, last):
        """Whether it runs at this evaluation step (`last`: the run's final one)."""
        return True

    def run(self, step, last, model):
        """(fields: its metrics and any other numbers for the eval record, text: ` | ...` after the val loss).
        `model` is the one evaluations run (compiled when the run compiles). Every rank calls it."""
        raise NotImplementedError

    def scalars(self, fields):
        """Its log.txt lines: {kind: value} of its plotted metrics in `fields`."""
        return {m.log_kind or m.name: fields[m.name] for m in self.metrics if m.plotted and m.name in fields}
