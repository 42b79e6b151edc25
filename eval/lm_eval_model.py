"""nanoact GPT-2 checkpoints inside lm-evaluation-harness: any lm-eval task, on our own model code.
(log/aglu/model_19073.pt: the last checkpoint of the README's recipe; a run directory means its newest.)

    python -m eval.lm_eval_model --model nanoact --model_args checkpoint=log/aglu/model_19073.pt \
        --tasks hellaswag,piqa --device cuda --batch_size 32
    python eval/lm_eval_model.py --model nanoact --model_args hf=path/to/gpt2 --tasks lambada_openai

lm-eval finds models only in its registry, and its CLI cannot import this module by itself: importing
it registers "nanoact", then lm-eval's own CLI (`cli_evaluate`) runs with all of its options
(--include_path for local task yamls, --limit, --output_path, ...). model_args: checkpoint=PATH (file
or run directory) or hf=DIR, dtype=auto|float32|bfloat16, compile=True, max_gen_toks=N.
Tokenizer: tiktoken gpt2 (EOT 50256), the tokenizer GPT-2 and our FineWeb shards use.
Continuous scores: lm-eval's loglikelihood requests return (log-likelihood, is_greedy) only, and its tasks
aggregate acc and acc_norm; run with --log_samples and eval/hellaswag_items.py reads the samples file's
per-choice log-likelihoods into the gold ending's bits per byte, probability among the options and margin.
"""
import torch
# lm-eval fills its registry with its own models ("hf", ...) only while the registry is empty: imported before
# "nanoact" registers, so that `--model hf` and simple_evaluate(model="hf") keep working beside it.
import lm_eval.models  # noqa: F401
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from data.tokenizer import EOT, VOCAB_SIZE, gpt2_tokenizer
from errors import ConfigError
from eval.scoring import bucket, row_length, score_rows
from model import GPT
from training.checkpoint import load_checkpoint
from training.distributed import pick_device
from training.precision import autocast_for


def as_bool(value):
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")


@register_model("nanoact")
class NanoactLM(TemplateLM):
    def __init__(self, checkpoint=None, hf=None, device="auto", batch_size=16, dtype="auto", compile=False,
                 max_gen_toks=256, max_batch_size=None):
        super().__init__()
        if (checkpoint is None) == (hf is None):
            raise ConfigError("nanoact model_args need checkpoint=PATH (file or run directory) or hf=DIR, not both")
        del max_batch_size  # lm-eval always passes it; batches here have a fixed size
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ConfigError(f"batch_size={batch_size!r}: give a positive integer ('auto' is not supported)")
        self._device = pick_device(device or "auto")
        model = GPT.from_pretrained(hf) if hf else GPT.from_checkpoint(load_checkpoint(checkpoint, kind="gpt2"), self._device)
        self.model = model.to(self._device).eval()
        self.block_size = self.model.config.block_size
        if as_bool(compile):
            self.model = torch.compile(self.model)
        device_type = self._device.split(":")[0]
        self.autocast = autocast_for(device_type, dtype)
        self.batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.enc = gpt2_tokenizer()

    @property
    def eot_token_id(self):
        return EOT

    @property
    def max_length(self):
        return self.block_size

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.enc.encode_ordinary(string)

    def tok_decode(self, tokens):
        return self.enc.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """(log p(continuation | context), continuation is the greedy one) for (key, ctx, cont) requests.
        Longest first, so the largest batch shape (and any out-of-memory) comes at once."""
        lengths = [row_length(ctx, cont, self.block_size) for _, ctx, cont in requests]
        order = sorted(range(len(requests)), key=lambda i: -lengths[i])
        out = [None] * len(requests)
        for start in tqdm(range(0, len(order), self.batch_size), desc="loglikelihood", disable=disable_tqdm):
            chunk = order[start:start + self.batch_size]
            rows = [(requests[i][1], requests[i][2]) for i in chunk]
            ll, _, greedy = score_rows(self.model, rows, bucket(lengths[chunk[0]], self.block_size), self.batch_size,
                                       self._device, self.autocast)
            for k, i in enumerate(chunk):
                out[i] = (ll[k].item(), bool(greedy[k]))
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Total log-likelihood of each string: EOT-prefixed, in disjoint windows of block_size tokens,
        each conditioned on the block_size tokens before it (lm-eval's rolling windows, context_len=1)."""
        windows, owner = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=EOT, max_seq_len=self.block_size, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(r)
        totals = [0.0] * len(requests)
        for r, (ll, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[r] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy continuations, stopped at EOT, at the first `until` string (cut off) or after max_gen_toks."""
        out = []
        batches = range(0, len(requests), self.batch_size)
        for start in tqdm(batches, desc="generate_until", disable=disable_tqdm):
            chunk = [req.args for req in requests[start:start + self.batch_size]]
            stops, limits = [], []
            for _, kwargs in chunk:
                if as_bool(kwargs.get("do_sample", False)):
                    raise ValueError("the nanoact lm-eval model generates greedily only (do_sample=True asked for)")
                until = kwargs.get("until") or []
                stops.append([until] if isinstance(until, str) else list(until))
                limits.append(int(kwargs.get("max_gen_toks", self.max_gen_toks)))
            tokens = self.greedy([self.tok_encode(ctx) or [EOT] for ctx, _ in chunk], limits, stops)
            for (ctx, kwargs), toks, until in zip(chunk, tokens, stops):
                text = self.tok_decode(toks)
                for stop in until:
                    text = text.split(stop)[0]
                self.cache_hook.add_partial("generate_until", (ctx, kwargs), text)
                out.append(text)
        return out

    @torch.no_grad()
    def greedy(self, prompts, limits, stops):
        """Generated tokens per prompt. Rows of unequal length share a right-padded batch: attention is
        causal, so the pad after a row's last token cannot change that token's logits. Like
        GPT.generate, a row longer than block_size is cropped to its last block_size tokens."""
        seqs, new = [list(p) for p in prompts], [[] for _ in prompts]
        active = [i for i in range(len(prompts)) if limits[i] > 0]
        while active:
            views = [seqs[i][-self.block_size:] for i in active]
            idx = torch.full((len(active), bucket(max(map(len, views)), self.block_size)), EOT, dtype=torch.long)
            for r, v in enumerate(views):
                idx[r, :len(v)] = torch.tensor(v)
            with self.autocast:
                logits, _ = self.model(idx.to(self._device))
            last = torch.tensor([len(v) - 1 for v in views], device=logits.device)
            picks = logits[torch.arange(len(active), device=logits.device), last, :VOCAB_SIZE].argmax(-1).tolist()
            still = []
            for i, t in zip(active, picks):
                seqs[i].append(t)
                new[i].append(t)
                if t == EOT:
                    new[i].pop()
                elif len(new[i]) < limits[i] and not any(s in self.tok_decode(new[i]) for s in stops[i]):
                    still.append(i)
            active = still
        return new

    def get_model_info(self):
        return {"model_num_parameters": sum(p.numel() for p in self.model.parameters()), "tokenizer": "tiktoken gpt2"}


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
