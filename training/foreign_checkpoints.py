"""GPT-2 checkpoints written by karpathy/build-nanogpt and karpathy/nanoGPT, read as data into nanoact's form.

- build-nanogpt (train_gpt2.py): log/model_NNNNN.pt = {'model': state dict, 'config': GPTConfig, 'step',
  'val_loss'}, where GPTConfig is a dataclass (block_size, vocab_size, n_layer, n_head, n_embd) pickled from
  the script's __main__. GELU is the tanh approximation; biases everywhere.
- nanoGPT (train.py): out_dir/ckpt.pt = {'model', 'optimizer', 'model_args': dict(n_layer, n_head, n_embd,
  block_size, bias, vocab_size, dropout), 'iter_num', 'best_val_loss', 'config': dict}. GELU is exact
  (nn.GELU()); bias=False drops the biases of every Linear and LayerNorm, as our GPTConfig.bias does. Without
  flash attention its blocks carry an `attn.bias` causal-mask buffer, which is no weight.
Both save the compiled (`_orig_mod.`) or DDP-wrapped (`module.`) model's keys at times; the prefixes go.

Nothing here runs their pickles: the file's pickle is first scanned for the names it holds, and only files
that look like one of these formats are then loaded with torch.load(weights_only=True), build-nanogpt's
GPTConfig class being replaced by ConfigRecord, a class with no code that only receives the fields.
The result is a nanoact checkpoint dict (kind "gpt2", model, model_config in our GPTConfig's field names,
step, config, val_loss) plus `source`, the one line saying what was recognised.
"""
import pickletools
import re
import zipfile
from pathlib import Path

import torch

from errors import CheckpointError

# the GPT-2 architecture fields both formats share with our GPTConfig
ARCHITECTURE = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")
PREFIXES = ("_orig_mod.", "module.")
STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"}


class ForeignCheckpointError(CheckpointError):
    pass


class ConfigRecord:
    """Stands in for a pickled config dataclass: the unpickler only fills its __dict__."""


def nanogpt_checkpoint_in(directory):
    """nanoGPT's out_dir/ckpt.pt, if `directory` has one (its run directories hold no model_*.pt)."""
    path = Path(directory) / "ckpt.pt"
    return path if path.is_file() else None


def read_foreign_checkpoint(path, kind=None, map_location="cpu"):
    """The checkpoint at `path` in nanoact's form if it is build-nanogpt's or nanoGPT's, else None."""
    names = _pickle_names(path)
    if names is None:
        return None
    strings, classes = names
    configs = sorted(c for c in classes if c.rsplit(".", 1)[-1] == "GPTConfig")
    looks_nanogpt = {"model_args", "iter_num"} <= strings
    if "kind" in strings or not (configs or looks_nanogpt):
        return None
    if kind not in (None, "gpt2"):
        raise ForeignCheckpointError(f"{path}: a GPT-2 checkpoint (build-nanogpt/nanoGPT), but this command "
                                     f"needs a {kind!r} one")
    try:
        with torch.serialization.safe_globals([(ConfigRecord, name) for name in configs]):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # weights_only refuses any other callable the file asks for, before running it
        wanted = re.search(r"GLOBAL ([\w.]+)", str(e))
        detail = f"it would call {wanted.group(1)}; nothing was run" if wanted else \
            (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ForeignCheckpointError(f"{path}: looks like a build-nanogpt/nanoGPT checkpoint but cannot be read as "
                                     f"data ({detail})") from None
    if not isinstance(state, dict) or "model" not in state:
        return None
    if isinstance(state.get("model_args"), dict):
        return _from_nanogpt(state, path)
    if isinstance(state.get("config"), ConfigRecord):
        return _from_build_nanogpt(state, path)
    return None


def _from_build_nanogpt(state, path):
    fields = vars(state["config"])
    missing = [f for f in ARCHITECTURE if f not in fields]
    if missing:
        raise ForeignCheckpointError(f"{path}: its GPTConfig lacks {', '.join(missing)}; not a build-nanogpt GPT-2")
    config = {f: int(fields[f]) for f in ARCHITECTURE}
    # build-nanogpt's MLP is nn.GELU(approximate='tanh'), our "gelu"
    model_config = {**config, "dropout": 0.0, "bias": True, "act": "gelu", "act_kwargs": {}, "plain_top_k": 0}
    step = int(state.get("step", 0))
    return _nanoact_dict(state["model"], model_config, step, {}, state.get("val_loss"), path,
                         f"build-nanogpt checkpoint (step {step})")


def _from_nanogpt(state, path):
    args = state["model_args"]
    missing = [f for f in (*ARCHITECTURE, "bias") if args.get(f) is None]
    if missing:
        raise ForeignCheckpointError(f"{path}: its model_args lack {', '.join(missing)}; not a nanoGPT GPT-2")
    # nanoGPT's MLP is nn.GELU(), the exact erf form
    model_config = {**{f: int(args[f]) for f in ARCHITECTURE}, "dropout": float(args.get("dropout", 0.0)),
                    "bias": bool(args["bias"]), "act": "gelu_exact", "act_kwargs": {}, "plain_top_k": 0}
    step = int(state.get("iter_num", 0))
    config = state.get("config") if isinstance(state.get("config"), dict) else {}
    best = state.get("best_val_loss")
    best = float(best) if best is not None else None
    return _nanoact_dict(state["model"], model_config, step, config, best, path,
                         f"nanoGPT checkpoint (iter {step}, bias={model_config['bias']})")


def _nanoact_dict(foreign_state, model_config, step, config, val_loss, path, what):
    model = _gpt2_weights(foreign_state, model_config, path)
    c = model_config
    source = (f"{path}: recognised a {what}: {c['n_layer']} layers, {c['n_head']} heads, d {c['n_embd']}, "
              f"vocab {c['vocab_size']}, block {c['block_size']}, act {c['act']}")
    return {"kind": "gpt2", "model": model, "model_config": model_config, "config": config, "step": step,
            "val_loss": float(val_loss) if val_loss is not None else None, "path": str(path), "source": source}


def _gpt2_weights(state, c, path):
    """Their state dict in ours: prefixes stripped, mask buffers dropped, tied embeddings checked, and every
    tensor's name and shape checked against the GPT-2 layout of the config (one line on a mismatch)."""
    out = {}
    for key, value in state.items():
        for prefix in PREFIXES:
            key = key.removeprefix(prefix)
        if key.endswith(".attn.bias") and value.dim() == 4:  # nanoGPT's causal mask without flash attention
            continue
        out[key] = value
    wte, head = out.get("transformer.wte.weight"), out.get("lm_head.weight")
    if wte is not None and head is not None and not torch.equal(wte, head):
        raise ForeignCheckpointError(f"{path}: lm_head.weight differs from transformer.wte.weight; nanoact's GPT ties "
                                     "them, so these untied embeddings cannot be loaded")
    if wte is None or head is None:  # one name of the tied pair is enough
        out["transformer.wte.weight"] = out["lm_head.weight"] = wte if wte is not None else head
    expected = gpt2_layout(c)
    unexpected = sorted(set(out) - set(expected))
    missing = sorted(k for k in expected if out.get(k) is None)
    wrong = [f"{k} {tuple(out[k].shape)} (expected {expected[k]})" for k in expected
             if out.get(k) is not None and tuple(out[k].shape) != expected[k]]
    if unexpected or missing or wrong:
        problems = "; ".join(p for p in (f"unexpected {unexpected[:3]}" if unexpected else "",
                                         f"missing {missing[:3]}" if missing else "",
                                         f"wrong shapes {wrong[:2]}" if wrong else "") if p)
        raise ForeignCheckpointError(f"{path}: weights do not fit a GPT-2 with its config ({problems})")
    return out


def gpt2_layout(c):
    """{name: shape} of every weight of a GPT-2 with config dict c (names as in model.py and both formats)."""
    C, V, bias = c["n_embd"], c["vocab_size"], c["bias"]
    layout = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (c["block_size"], C),
              "transformer.ln_f.weight": (C,), "lm_head.weight": (V, C)}
    per_layer = {"ln_1.weight": (C,), "attn.c_attn.weight": (3 * C, C), "attn.c_proj.weight": (C, C),
                 "ln_2.weight": (C,), "mlp.c_fc.weight": (4 * C, C), "mlp.c_proj.weight": (C, 4 * C)}
    if bias:
        layout["transformer.ln_f.bias"] = (C,)
        per_layer.update({"ln_1.bias": (C,), "attn.c_attn.bias": (3 * C,), "attn.c_proj.bias": (C,),
                          "ln_2.bias": (C,), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.bias": (C,)})
    for i in range(c["n_layer"]):
        layout.update({f"transformer.h.{i}.{k}": v for k, v in per_layer.items()})
    return layout


def _pickle_names(path):
    """(strings, classes) named in a torch.save zip archive's pickle, read with pickletools, which parses the
    opcodes and calls nothing; None for anything else (torch's legacy format, not a zip, no pickle)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickle_name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if pickle_name is None:
                return None
            data = archive.read(pickle_name)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):  # damaged bytes (a bad name decodes as
        return None  # UnicodeDecodeError): left to the ordinary loader, which checks the checksum and reports it
    strings, classes, recent = set(), set(), []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in STRING_OPS:
                strings.add(arg)
                recent = (recent + [arg])[-2:]
            elif op.name == "GLOBAL":  # protocol 2, torch.save's default: "module name"
                classes.add(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(recent) == 2:  # protocol 4+: the two strings pushed before
                classes.add(".".join(recent))
    except ValueError:  # a damaged pickle: left to the ordinary loader, which reports it
        return None
    return strings, classes
