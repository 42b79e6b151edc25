"""Read a run directory into numbers: ours (`log.txt`, `metrics.jsonl`, `run.json`), build-nanogpt's `log.txt`
or llm.c's `main.log`.

A run directory holds any of:
  log.txt        `STEP KIND VALUE` lines (build-nanogpt's format): train, val, and the plotted in-loop metrics
                 (hella: HellaSwag acc_norm, bleu, ...)
  main.log       llm.c's (`train_gpt2.cu -o DIR`) `s:STEP trl:LOSS lr:LR norm:NORM` train lines, `s:STEP tel:LOSS`
                 val lines and `s:STEP eval:ACC` HellaSwag lines (acc_norm: the lowest mean token loss wins)
  metrics.jsonl  one JSON object per line with "step" and "kind": train records (loss, tok_per_s, tokens)
                 and eval records (val_loss, val_bpb (bits per byte), the in-loop metrics, telemetry, tokens)
  run.json       {"config": ..., "lr": ..., "metrics": ..., "environment": ..., "segments": ...}: activation, seed,
                 max_steps, tokens per step, the learning rate a sweep sets; the in-loop metrics and how to show them (training/in_loop.py's Metric); per
                 start of the run (segments) its versions, precision, compile, kernels and source
  hellaswag_*.json  results of eval/hellaswag.py on the run's checkpoints (both scorings); the full one
                 (no --limit) of the latest step is shown, else the largest limited one
metrics.jsonl wins for every series it has; log.txt, then main.log fill in the rest (build-nanogpt and llm.c
write nothing else). In log.txt and main.log a later line for a step wins: a restarted run logs its steps again.
A run still being written may end in a half-written line: that last line is skipped, any other bad line
is an error naming the file and line.
"""
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from errors import DataError
from training.in_loop import Metric

HELLASWAG_ITEMS = 10042  # the validation set build-nanogpt and our trainer score when no limit is set
# The in-loop metrics of a run whose run.json declares none (one written before runs declared them, build-nanogpt's
# log.txt, llm.c's main.log): as eval/hellaswag_in_loop.py and eval/bleu_in_loop.py declare them
# (tests/test_compare.py holds them equal), HellaSwag over the run's --hellaswag-limit items, else all
HELLASWAG_ACC = Metric("hellaswag_acc", "HellaSwag acc", "acc", plotted=False)
HELLASWAG_ACC_NORM = Metric("hellaswag_acc_norm", "HellaSwag acc_norm", "acc_norm", log_kind="hella")
VALID_BLEU = Metric("bleu", "valid BLEU (greedy)", "BLEU", fmt=".2f")

# metrics.jsonl field -> series name, besides the in-loop metrics (each its own name's series)
METRIC_SERIES = {"loss": "train", "val_loss": "val", "val_bpb": "val_bpb"}
LOG_KINDS = {"train": "train", "val": "val"}  # log.txt kind -> series name, besides the plotted in-loop metrics
LLMC_STREAMS = {"trl": "train", "tel": "val", "eval": HELLASWAG_ACC_NORM.name}  # llm.c's llmc/logger.h -> series


class RunError(DataError):
    """A run directory that cannot be read; the message is one line that says what to do."""


@dataclass
class RunRecord:
    """What a run directory records, read back: its config, series, telemetry and evaluations."""
    path: Path
    label: str
    config: dict | None = None
    lr: float | None = None  # the learning rate a sweep sets (run.json's `lr`; older runs: max_lr, else lr)
    series: dict = field(default_factory=dict)  # name -> sorted [(step, value, tokens or None)]
    telemetry: list = field(default_factory=list)  # [(step, tokens or None, telemetry dict)]
    measures: list = field(default_factory=list)  # [(step, tokens or None, measure dict)]: analysis/literature_measures.py
    tok_per_s: list = field(default_factory=list)
    hellaswag_eval: dict | None = None  # the chosen hellaswag_*.json record, plus its "file"
    test: dict | None = None  # translation: the test-set BLEU record written after the last step
    kernels: dict | None = None  # run.json's activation kernel decisions {family: {impl, reason, ...}}
    segments: list = field(default_factory=list)  # run.json's starts: [{"start_step", "environment"}]
    metrics: dict = field(default_factory=dict)  # name -> Metric: its in-loop metrics (run.json's, else earlier ones)

    def setting(self, name):
        """A config leaf by name (config option names are unique across sections), or None."""
        return config_value(self.config, name) if self.config else None

    @property
    def last_step(self):
        steps = [points[-1][0] for points in self.series.values() if points]
        return max(steps) if steps else None


def config_value(table, name):
    """The value of option `name` in a nested config table, whichever section holds it, or None."""
    for key, value in table.items():
        if key == name:
            return value
        if isinstance(value, dict):
            found = config_value(value, name)
            if found is not None:
                return found
    return None


def _lines(path):
    """(line number, text) of non-empty lines, dropping an unterminated last line: a writer may be mid-line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines = lines[:-1]
    return [(i + 1, line) for i, line in enumerate(lines) if line.strip()]


def read_log_txt(path, kinds):
    """{series: {step: value}} from build-nanogpt's `STEP KIND VALUE` lines of the kinds in `kinds` (kind ->
    series name)."""
    out = {}
    for n, line in _lines(path):
        parts = line.split()
        try:
            step, kind, value = int(parts[0]), parts[1], float(parts[2])
            if len(parts) != 3:
                raise ValueError
        except (ValueError, IndexError):
            raise RunError(f"{path}:{n}: cannot parse {line[:60]!r}; expected 'STEP KIND VALUE' lines "
                           "such as '100 val 3.2841'") from None
        if kind in kinds:
            out.setdefault(kinds[kind], {})[step] = value  # a later line for the same step (restarted run) wins
    return out


def read_main_log(path):
    """{series: {step: value}} from llm.c's main.log (`s:STEP NAME:VALUE ...` lines, llmc/logger.h)."""
    out = {}
    for n, line in _lines(path):
        try:
            fields = dict(field.split(":", 1) for field in line.split())
            step = int(fields.pop("s"))
            values = {name: float(value) for name, value in fields.items()}
            if not line.startswith("s:") or not values:
                raise ValueError
        except (ValueError, KeyError):
            raise RunError(f"{path}:{n}: cannot parse {line[:60]!r}; expected llm.c's 's:STEP NAME:VALUE' lines "
                           "such as 's:100 tel:3.2841'") from None
        for name, value in values.items():
            if name in LLMC_STREAMS:
                out.setdefault(LLMC_STREAMS[name], {})[step] = value
    return out


def read_metrics(path):
    records = []
    for n, line in _lines(path):
        try:
            record = json.loads(line)
            int(record["step"])
        except (ValueError, TypeError, KeyError):
            raise RunError(f"{path}:{n}: not a metrics record {line[:60]!r}; expected one JSON object with "
                           "a \"step\" per line") from None
        records.append(record)
    return records


def read_hellaswag_results(run_dir):
    """The record of eval/hellaswag.py to show for a run: the full evaluation (no --limit) of the latest
    step, else the limited one with the most items (then the latest step); None if there is none."""
    records = []
    for file in sorted(run_dir.glob("hellaswag_*.json")):
        try:
            record = json.loads(file.read_text())
            results = record["results"]
            n = max(int(r["n"]) for r in results.values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise RunError(f"{file}: not a result of eval/hellaswag.py (a JSON object with \"results\"); "
                           "move it out of the run directory or rerun eval/hellaswag.py") from None
        records.append({**record, "file": str(file), "n": n})
    if not records:
        return None
    return max(records, key=lambda r: (r.get("limit") is None, r["n"] if r.get("limit") else 0, r.get("step") or 0))


def segments_of(info):
    """run.json's starts, each {"start_step", "environment"}; a run.json written before segments existed holds
    the environment of its latest start only, at a step it does not say (None)."""
    if isinstance(info.get("segments"), list):
        return info["segments"]
    return [{"start_step": None, "environment": info.get("environment") or {}}]


def declared_metrics(info, hellaswag_limit):
    """{name: Metric} of the in-loop metrics run.json declares; without declarations, the earlier ones."""
    if info is not None and "metrics" in info:
        return {m["name"]: Metric(**m) for m in info["metrics"]}
    items = hellaswag_limit or HELLASWAG_ITEMS
    return {m.name: m for m in (replace(HELLASWAG_ACC, items=items), replace(HELLASWAG_ACC_NORM, items=items),
                                VALID_BLEU)}


def metrics_of(runs):
    """{name: Metric} of every in-loop metric the runs declare, in the order they declare them."""
    found = {}
    for run in runs:
        for name, metric in run.metrics.items():
            found.setdefault(name, metric)
    return found


def load_run(path):
    path = Path(path)
    if path.is_file():  # `compare log/log.txt` works like `compare log`
        path = path.parent
    if not path.is_dir():
        raise RunError(f"{path}: no such run directory")
    log_txt, metrics, run_json = path / "log.txt", path / "metrics.jsonl", path / "run.json"
    main_log = path / "main.log"
    if not (log_txt.is_file() or metrics.is_file() or main_log.is_file()):
        raise RunError(f"{path}: no log.txt, metrics.jsonl or main.log here; pass the --out-dir of a training run "
                       "(build-nanogpt's log directory, llm.c's -o directory)")
    config = kernels = lr = None
    declared = declared_metrics(None, None)
    if run_json.is_file():
        try:
            info = json.loads(run_json.read_text())
            config = info["config"]
            declared = declared_metrics(info, config_value(config, "hellaswag_limit"))
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            raise RunError(f"{run_json}: not a run.json with a \"config\" object (and Metric records in "
                           "\"metrics\", if any)") from None
        kernels = ((info.get("environment") or {}).get("decisions") or {}).get("activations")
        # a run.json written before it stated `lr`: the GPT trainer's max_lr, else the translation trainer's lr
        lr = info.get("lr") or config_value(config, "max_lr") or config_value(config, "lr")
    run = RunRecord(path=path, label=path.name, config=config, lr=lr, hellaswag_eval=read_hellaswag_results(path),
                    kernels=kernels, segments=segments_of(info) if run_json.is_file() else [], metrics=declared)
    series = {**METRIC_SERIES, **{name: name for name in run.metrics}}
    kinds = {**LOG_KINDS, **{m.log_kind or m.name: m.name for m in run.metrics.values() if m.plotted}}

    per_step = {}  # series -> {step: (value, tokens)}
    if metrics.is_file():
        for r in read_metrics(metrics):
            step, tokens = int(r["step"]), r.get("tokens")
            for key, name in series.items():
                if isinstance(r.get(key), (int, float)):
                    per_step.setdefault(name, {})[step] = (float(r[key]), tokens)
            if isinstance(r.get("tok_per_s"), (int, float)):
                run.tok_per_s.append(float(r["tok_per_s"]))
            if isinstance(r.get("telemetry"), dict) and isinstance(r["telemetry"].get("layers"), list):
                run.telemetry.append((step, tokens, r["telemetry"]))
            if isinstance(r.get("measure"), dict):
                run.measures.append((step, tokens, r["measure"]))
            if r.get("kind") == "test":
                run.test = r
    logs = [read_log_txt(log_txt, kinds) if log_txt.is_file() else {},
            read_main_log(main_log) if main_log.is_file() else {}]
    for found in logs:
        for name, values in found.items():
            if name not in per_step:
                per_step[name] = {step: (value, None) for step, value in values.items()}

    # without token counts in the records, the config's tokens per step gives them (the trainer's convention:
    # a train record at step s has seen s+1 steps of data, an eval record at step s has seen s)
    per_step_tokens = run.setting("total_batch_size")
    for name, values in per_step.items():
        points = []
        for step, (value, tokens) in sorted(values.items()):
            if tokens is None and per_step_tokens:
                tokens = (step + (name == "train")) * per_step_tokens
            points.append((step, value, tokens))
        run.series[name] = points
    return run


def finished(path):
    """The run's final evaluation (at max_steps) is logged; translation: its test-set BLEU after the last step."""
    try:
        run = load_run(path)
    except RunError:
        return False
    if run.setting("test_at_end"):
        return run.test is not None
    val, max_steps = run.series.get("val"), run.setting("max_steps")
    return bool(val) and max_steps is not None and val[-1][0] == max_steps


def load_runs(paths):
    """Runs labelled `act/seedN` from run.json (else the directory name); clashing labels get the directory."""
    runs = [load_run(p) for p in paths]
    for run in runs:
        act, seed = run.setting("act"), run.setting("seed")
        if act is not None and seed is not None:
            run.label = f"{act}/seed{seed}"
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{run.label} [{run.path.name}]" if run.label != run.path.name else str(run.path)
    return runs


def summary(run):
    """The numbers of one run for tables: None where the run has no such metric (yet)."""
    def last(name):
        points = run.series.get(name)
        return points[-1] if points else None

    val = run.series.get("val") or []
    best = min(val, key=lambda p: p[1]) if val else None
    bpb = last("val_bpb")
    tokens = [p[2] for points in run.series.values() for p in points if p[2] is not None]
    scores = [t["anact_score"] for _, _, t in run.telemetry if isinstance(t.get("anact_score"), (int, float))]
    test = run.test or {}
    return {
        "label": run.label, "act": run.setting("act"), "seed": run.setting("seed"),
        "step": run.last_step, "max_steps": run.setting("max_steps"), "tokens": max(tokens) if tokens else None,
        "final_val": val[-1][1] if val else None, "best_val": best[1] if best else None,
        "best_val_step": best[0] if best else None, "final_val_bpb": bpb[1] if bpb else None,
        **{name: last(name)[1] if last(name) else None for name in run.metrics},  # each in-loop metric's last
        "tok_per_s": statistics.median(run.tok_per_s) if run.tok_per_s else None,
        "anact_score": scores[-1] if scores else None,
        "hella_eval": run.hellaswag_eval,  # eval/hellaswag.py's numbers: {"step", "n", "results": {scoring: ...}}
        "test_bleu_greedy": test.get("bleu_greedy"), "test_bleu_beam": next(
            (v for k, v in sorted(test.items()) if k.startswith("bleu_beam")), None),
    }


def markdown_table(headers, rows):
    """A pipe table that reads in a terminal and pastes into markdown."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda items: "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])
