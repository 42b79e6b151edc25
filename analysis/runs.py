"""Read a run directory into numbers: ours (`log.txt`, `metrics.jsonl`, `run.json`), build-nanogpt's `log.txt`
or llm.c's `main.log`.

A run directory holds any of:
  log.txt        `STEP KIND VALUE` lines (build-nanogpt's format): train, val, hella (acc_norm), bleu
  main.log       llm.c's (`train_gpt2.cu -o DIR`) `s:STEP trl:LOSS lr:LR norm:NORM` train lines, `s:STEP tel:LOSS`
                 val lines and `s:STEP eval:ACC` HellaSwag lines (acc_norm: the lowest mean token loss wins)
  metrics.jsonl  one JSON object per line with "step" and "kind": train records (loss, tok_per_s, tokens)
                 and eval records (val_loss, val_bpb (bits per byte), hellaswag_acc, hellaswag_acc_norm, bleu, telemetry, tokens)
  run.json       {"config": ..., "lr": ..., "environment": ..., "segments": ...}: activation, seed, max_steps,
                 tokens per step, the learning rate a sweep sets; per start of the run (segments) its versions,
                 precision, compile, kernels and source
  hellaswag_*.json  results of eval/hellaswag.py on the run's checkpoints (both scorings); the full one
                 (no --limit) of the latest step is shown, else the largest limited one
metrics.jsonl wins for every series it has; log.txt, then main.log fill in the rest (build-nanogpt and llm.c
write nothing else). In log.txt and main.log a later line for a step wins: a restarted run logs its steps again.
A run still being written may end in a half-written line: that last line is skipped, any other bad line
is an error naming the file and line.
"""
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from errors import DataError
from stats.significance import wilson

HELLASWAG_ITEMS = 10042  # the validation set build-nanogpt and our trainer score when no limit is set

# metrics.jsonl field -> series name; log.txt kinds use the series names directly
METRIC_SERIES = {"loss": "train", "val_loss": "val", "val_bpb": "val_bpb", "hellaswag_acc_norm": "hella", "hellaswag_acc": "hella_acc",
                 "bleu": "bleu"}
LOG_KINDS = {"train", "val", "hella", "bleu"}
LLMC_STREAMS = {"trl": "train", "tel": "val", "eval": "hella"}  # llm.c's llmc/logger.h -> series


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


def read_log_txt(path):
    """{kind: {step: value}} from build-nanogpt's `STEP KIND VALUE` lines."""
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
        if kind in LOG_KINDS:
            out.setdefault(kind, {})[step] = value  # a later line for the same step (restarted run) wins
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
    if run_json.is_file():
        try:
            info = json.loads(run_json.read_text())
            config = info["config"]
        except (ValueError, KeyError, TypeError, OSError):
            raise RunError(f"{run_json}: not a run.json with a \"config\" object") from None
        kernels = ((info.get("environment") or {}).get("decisions") or {}).get("activations")
        # a run.json written before it stated `lr`: the GPT trainer's max_lr, else the translation trainer's lr
        lr = info.get("lr") or config_value(config, "max_lr") or config_value(config, "lr")
    run = RunRecord(path=path, label=path.name, config=config, lr=lr, hellaswag_eval=read_hellaswag_results(path),
                    kernels=kernels, segments=segments_of(info) if run_json.is_file() else [])

    per_step = {}  # series -> {step: (value, tokens)}
    if metrics.is_file():
        for r in read_metrics(metrics):
            step, tokens = int(r["step"]), r.get("tokens")
            for key, name in METRIC_SERIES.items():
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
    for log, read in ((log_txt, read_log_txt), (main_log, read_main_log)):
        if log.is_file():
            for kind, values in read(log).items():
                if kind not in per_step:
                    per_step[kind] = {step: (value, None) for step, value in values.items()}

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
    limit = run.setting("hellaswag_limit")
    n_hella = limit if limit else HELLASWAG_ITEMS
    hella, hella_acc, bleu, bpb = last("hella"), last("hella_acc"), last("bleu"), last("val_bpb")
    tokens = [p[2] for points in run.series.values() for p in points if p[2] is not None]
    scores = [t["anact_score"] for _, _, t in run.telemetry if isinstance(t.get("anact_score"), (int, float))]
    test = run.test or {}
    return {
        "label": run.label, "act": run.setting("act"), "seed": run.setting("seed"),
        "step": run.last_step, "max_steps": run.setting("max_steps"), "tokens": max(tokens) if tokens else None,
        "final_val": val[-1][1] if val else None, "best_val": best[1] if best else None,
        "best_val_step": best[0] if best else None, "final_val_bpb": bpb[1] if bpb else None,
        "hella_acc": hella_acc[1] if hella_acc else None, "hella_acc_norm": hella[1] if hella else None,
        "hella_n": n_hella if hella or hella_acc else None,
        # the same 95% Wilson interval eval/hellaswag.py reports, from the accuracy and the item count
        "hella_acc_ci95": wilson(round(hella_acc[1] * n_hella), n_hella) if hella_acc else None,
        "hella_acc_norm_ci95": wilson(round(hella[1] * n_hella), n_hella) if hella else None,
        "bleu": bleu[1] if bleu else None, "best_bleu": max(p[1] for p in run.series["bleu"]) if bleu else None,
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
