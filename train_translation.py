"""Train a DeepNorm encoder-decoder Transformer on IWSLT De-En with any registered FFN activation; BLEU.

    python train_translation.py --config configs/translation_6l.toml --act swish          # HF IWSLT 2017
    python train_translation.py --config configs/translation_12l.toml --act nswish \\
        --act-kwargs '{"per_instance": true}' --plain-top-k 1                               # NSwish + 1 Swish
    python train_translation.py --config configs/translation_cpu_small.toml --data-dir DIR  # train.de, valid.en ...
    torchrun --standalone --nproc_per_node 4 train_translation.py --config configs/translation_6l.toml    # same steps
    python train_translation.py --eval-only log/translation_6l --split test --beam 5   # its newest checkpoint

Every option is a field of TrainConfig below: set it in a TOML file (--config) or as --name value.
--resume continues the newest checkpoint in --out-dir exactly (optimizer, data order, RNG streams).
An optimizer step is --total-max-tokens of batch budget on any number of processes: each process accumulates
total / (max_tokens * processes) batches, and the step's loss is the sum of its target tokens' losses over
all of them divided by their count (fairseq's normalisation), so 4 GPUs train the same steps as 1.
The loop itself (resume, logs, compile/DDP, checkpoints, signals) is training/loop.py, shared with
train_gpt2.py; this file holds what is the translation model's own: the model, the corpus, BLEU.
"""
import contextlib
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

import torch
import torch.distributed as dist

from activations import micro_batch_note, telemetry
from activations.gated import width_note
from data import DataError
from data.parallel_corpus import TokenBatchLoader, encode, load_sentencepiece, load_split, sentencepiece_model
from eval.bleu import split_bleu
from eval.bleu_in_loop import ValidBleu
from training import distributed
from training.checkpoint import load_checkpoint
from training.config import ConfigError, EvalConfig, RunConfig, from_dict, run_cli, to_dict
from training.loop import Evaluation, Parts, Trainer, no_sync_unless, param_line
from training.precision import autocast_for
from training.optimizer import adamw
from training.schedule import inverse_sqrt
from training.regional_compile import RegionallyCompiled, no_recompiles, warm_up
from translation.model import Transformer, TranslationConfig, ffn_width_args


@dataclass
class DataConfig:
    data_dir: str = ""  # directory with train.{src,tgt}, valid.*, test.* ("" and no prefixes: HF hub)
    train_prefix: str = ""  # files {prefix}.{lang}[.gz]; override data_dir per split
    valid_prefix: str = ""
    test_prefix: str = ""
    src_lang: str = "de"
    tgt_lang: str = "en"
    hf_dataset: str = "IWSLT/iwslt2017"
    hf_config: str = "iwslt2017-de-en"
    spm_vocab_size: int = 10000  # joint source+target sentencepiece vocabulary
    spm_type: str = "bpe"  # or unigram
    spm_dir: str = ""  # sentencepiece cache ("": out_dir)
    max_len: int = 50  # training pairs with a longer side (in pieces) are dropped (ANAct, Table 9)
    max_tokens: int = 4096  # per batch (what one process runs at once): sentences * longest side
    max_sentences: int = 0  # per batch (0: no limit)
    total_max_tokens: int = 0  # budget of one optimizer step, all processes and accumulated batches: a multiple
    #                            of max_tokens * processes (0: max_tokens, one batch on one process)
    pad_multiple: int = 0  # pad training batches to lengths in multiples of N: few shapes for torch.compile
    #                        (0: 8 when compiling, else 1 = exact lengths)


@dataclass
class OptimConfig:
    lr: float = 5e-4
    warmup_steps: int = 4000
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0001  # fairseq's IWSLT recipe; matrices only
    grad_clip: float = 3.0
    label_smoothing: float = 0.1
    epochs: int = 20
    max_steps: int = 0  # > 0 overrides epochs

    # what a sweep's lr sets (sweep/plan.py; run.json's `lr`): the peak of the inverse square root, which scales
    # its whole schedule
    swept_lr: ClassVar[tuple] = ("lr",)


@dataclass
class TranslationEvalConfig(EvalConfig):
    eval_interval: int = 1000
    eval_only: str = ""  # a checkpoint (or its directory): translate --split with greedy and beam, no training
    split: str = "test"
    beam: int = 5
    len_penalty: float = 1.0  # beam scores are sum(log p) / length**len_penalty
    max_len_a: float = 1.2  # output length cap: a * source length + b
    max_len_b: int = 10
    decode_batch: int = 64  # sentences per decoding batch
    bleu_sentences: int = 0  # validation BLEU (greedy) on the first N valid sentences; 0: all
    test_at_end: bool = True  # greedy and beam BLEU on the test split after the last step
    test_sentences: int = 0  # final greedy/beam BLEU (and --eval-only) on the first N sentences; 0: all

    # when, and how fast: decode_batch groups the same sentences; eval_only and split do not train
    resume_may_change: ClassVar[tuple] = (*EvalConfig.resume_may_change, "test_at_end", "decode_batch", "eval_only",
                                          "split")


@dataclass
class TrainConfig:
    model: TranslationConfig = field(default_factory=TranslationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: TranslationEvalConfig = field(default_factory=TranslationEvalConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="log/translation", checkpoint_interval=2000,
                                                            log_interval=50))

    resume_may_change: ClassVar[tuple] = ("model",)  # resume_training compares the model's config itself


def split_lines(data, split):
    prefix = {"train": data.train_prefix, "valid": data.valid_prefix, "test": data.test_prefix}[split]
    return load_split(split, data.src_lang, data.tgt_lang, data.data_dir, prefix, data.hf_dataset, data.hf_config)


def accumulation(data, world_size):
    """Batches each process accumulates per optimizer step so that the step is total_max_tokens of budget."""
    total, per_pass = data.total_max_tokens or data.max_tokens, data.max_tokens * world_size
    if total % per_pass:
        raise ConfigError(f"total_max_tokens {total} is not a multiple of max_tokens * processes = {data.max_tokens} * "
                          f"{world_size} = {per_pass}; change --max-tokens (the batch one process runs at once) or "
                          "--total-max-tokens (the optimizer step)")
    return total // per_pass


def tokenizer(cfg, d, src, tgt):
    """The run's sentencepiece model (bytes): rank 0 trains or finds it in the cache, the others then read it."""
    cache = cfg.data.spm_dir or cfg.run.out_dir
    args = (src, tgt, cfg.data.spm_vocab_size, cfg.data.spm_type, cache)
    model = sentencepiece_model(*args) if d.master else None
    if d.ddp:
        dist.barrier()
        model = model or sentencepiece_model(*args)
    return model


class TranslationTrainer(Trainer):
    """The model (the DeepNorm encoder-decoder with the run's activation), the parallel corpus in token-budget
    batches, and the evaluations: validation loss, greedy BLEU, activation telemetry; test BLEU at the end."""
    kind = "translation"
    token_unit = "tgt tok"
    in_loop = (ValidBleu,)  # beside the val loss (training/in_loop.py): a new evaluation is one file and one entry
    warmed_up = False  # compile() ran every padded batch shape: a step that compiles again is then an error

    def build(self, ctx, ckpt):
        cfg, d, o = self.cfg, ctx.dist, self.cfg.optim
        self.ctx = ctx
        Transformer.check_config(cfg.model)  # a bad activation or option fails before the data is read
        self.accum = accumulation(cfg.data, d.world_size)
        train_src, train_tgt = split_lines(cfg.data, "train")
        self.spm_bytes = ckpt["spm"] if ckpt else tokenizer(cfg, d, train_src, train_tgt)
        self.sp = sp = load_sentencepiece(self.spm_bytes)
        mcfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or sp.get_piece_size())
        if mcfg.vocab_size != sp.get_piece_size():
            raise ConfigError(f"vocab_size {mcfg.vocab_size} differs from the sentencepiece model's "
                              f"{sp.get_piece_size()}; leave vocab_size at 0 to take it from the tokenizer")
        if (mcfg.pad_id, mcfg.bos_id, mcfg.eos_id) != (sp.pad_id(), sp.bos_id(), sp.eos_id()):
            raise ConfigError(f"pad/bos/eos ids {mcfg.pad_id}/{mcfg.bos_id}/{mcfg.eos_id} differ from the "
                              f"sentencepiece model's {sp.pad_id()}/{sp.bos_id()}/{sp.eos_id()}; leave them at their "
                              "defaults")
        self.model = Transformer(mcfg, seed=cfg.run.init_seed).to(d.device)
        train_ids = encode(sp, train_src, train_tgt, cfg.data.max_len)
        self.valid_text = split_lines(cfg.data, "valid")
        valid_ids = encode(sp, *self.valid_text, mcfg.max_positions - 1)
        pad_multiple = cfg.data.pad_multiple or (8 if ctx.compile else 1)
        self.loader = TokenBatchLoader(*train_ids, cfg.data.max_tokens, cfg.data.max_sentences, d.rank,
                                       d.world_size, seed=cfg.run.seed, pad_multiple=pad_multiple, accum=self.accum)
        self.val_loader = TokenBatchLoader(*valid_ids, cfg.data.max_tokens, 0, d.rank, d.world_size, shuffle=False)
        shapes, step_batches = self.loader.shapes(), self.accum * d.world_size
        step = (f"{step_batches} batch{'es' * (step_batches > 1)} (grad accum {self.accum}) of <= "
                f"{cfg.data.max_tokens} tokens" + (f", <= {step_batches * cfg.data.max_sentences} sentences"
                                                   if cfg.data.max_sentences else ""))
        return Parts(model=self.model, loader=self.loader, model_config=to_dict(mcfg),
                     optimizer=adamw(self.model, o.lr, o.weight_decay, o.betas, o.eps, d.device_type),
                     max_steps=o.max_steps or o.epochs * self.loader.steps_per_epoch(),
                     mlp_shape=(cfg.data.max_tokens, self.model.encoder[0].ffn.fc1.out_features),
                     batch_shapes=shapes, params=self.model.param_counts(), accum=self.accum,
                     description=f"{param_line(self.model.param_counts())}{width_note(*ffn_width_args(mcfg))} | "
                                 f"act {mcfg.act} (plain top "
                                 f"{mcfg.plain_top_k}) | {mcfg.norm} {mcfg.enc_layers}-{mcfg.dec_layers} | vocab "
                                 f"{mcfg.vocab_size} | {len(train_ids[0])} train pairs (of {len(train_src)}, max len "
                                 f"{cfg.data.max_len}) | step: {step} | {self.loader.steps_per_epoch()} steps/epoch | "
                                 f"{f'{shapes} batch shapes' if shapes else 'exact-length batches'}"
                                 f"{micro_batch_note(self.model, step_batches)}")

    def inputs(self):
        """The test split's sources and references, read before step 0 when the run ends with test BLEU."""
        return [self.read_test_split] if self.cfg.eval.test_at_end else []

    def read_test_split(self):
        try:
            self.test_text = split_lines(self.cfg.data, "test")
        except DataError as e:
            raise type(e)(f"test BLEU at the end (--test-at-end): {e}; or train without it: --test-at-end false") \
                from None

    def compile(self, ctx, parts, step, log):
        """Each encoder and decoder layer compiled once, batch and sequence dimensions dynamic
        (training/regional_compile.py); padded batches: every shape compiled in a warm-up before the first step, so the
        steps' times are steps'. Exact-length batches (--pad-multiple 1) compile the few shapes dynamic
        ones still specialise on as they come."""
        compiled = RegionallyCompiled(self.model, mode=self.cfg.run.compile_mode)
        if self.loader.pad_multiple > 1:
            shapes = self.loader.padded_shapes()
            seconds, graphs = warm_up(compiled, self.model, shapes, ctx.autocast, ctx.dist.device)
            self.warmed_up = True
            log.record(step, kind="compile", seconds=seconds, graphs=graphs, batch_shapes=len(shapes))
            if ctx.dist.master:
                print(f"compile: {graphs} graphs for {len(shapes)} batch shapes in {seconds:.1f}s (warm-up, not "
                      "counted in the steps' times)", flush=True)
        return compiled

    def learning_rate(self, step):
        return inverse_sqrt(step, self.cfg.optim.warmup_steps, self.cfg.optim.lr)

    def forward_backward(self, model, seed_micro_batch):
        """The step's loss is sum(token losses) / (target tokens of every batch of the step, all ranks): each
        target token weighs the same whichever batch or rank it is in (fairseq), so the gradient is that of
        one batch holding them all. DDP averages the ranks' gradients, hence the factor world_size."""
        d, pad = self.ctx.dist, self.model.cfg.pad_id
        batches = [self.loader.next_batch() for _ in range(self.accum)]  # counted on the CPU: no device sync
        counts = [int((y_out != pad).sum()) for _, _, y_out in batches]
        tokens = sum(counts)
        # every batch's loss is divided by the step's count: one small all-reduce (and sync) before any backward
        total = distributed.all_reduce_sum(torch.tensor(tokens, device=d.device), d).item() if d.ddp else tokens
        scale = d.world_size / total
        loss_sum = torch.zeros((), device=d.device)
        for micro, (batch, count) in enumerate(zip(batches, counts)):
            seed_micro_batch(micro)
            x, y_in, y_out = (t.to(d.device, non_blocking=True) for t in batch)
            guard = no_recompiles(x.shape) if self.warmed_up else contextlib.nullcontext()
            with no_sync_unless(micro == self.accum - 1, model), guard:
                with self.ctx.autocast:
                    # the mean over the batch's non-pad targets (label smoothing included) times their count
                    loss = self.model.loss(model(x, y_in), y_out, self.cfg.optim.label_smoothing) * (count * scale)
                loss_sum += loss.detach()
                self.ctx.scaler.scale(loss).backward()
        return loss_sum, tokens

    def step_fields(self, tok_per_s):
        return {"epoch": self.loader.epoch}

    def checkpoint_state(self, evaluation):
        return {"bleu": evaluation.get("bleu") if evaluation else None, "spm": self.spm_bytes}

    def evaluate(self, step, last, model):
        """Validation loss on the whole valid split and activation telemetry (on a mid-length validation batch),
        on the uncompiled model, as the valid BLEU after it (an in-loop evaluation: eval/bleu_in_loop.py)."""
        d, model = self.ctx.dist, self.model
        val = self.validation_loss()
        result = Evaluation({"val_loss": val}, f"val loss {val:.4f}", {"val": val})
        if d.master:
            x, y_in, _ = self.val_loader.batch(len(self.val_loader) // 2)
            result.fields["telemetry"] = telemetry.collect(model, (x.to(d.device), y_in.to(d.device)),
                                                           self.ctx.autocast)
        return result

    @torch.no_grad()
    def validation_loss(self):
        """Token-level cross-entropy (no label smoothing) over the whole validation set, all ranks."""
        model, d = self.model, self.ctx.dist
        model.eval()
        total = torch.zeros(2, device=d.device)
        for x, y_in, y_out in self.val_loader:
            x, y_in, y_out = x.to(d.device), y_in.to(d.device), y_out.to(d.device)
            with self.ctx.autocast:
                logits = model(x, y_in)
            n = (y_out != model.cfg.pad_id).sum()
            total += torch.stack([model.loss(logits, y_out) * n, n.float()])
        model.train()
        total = distributed.all_reduce_mean(total, d)
        return (total[0] / total[1]).item()

    def finish(self, step):
        """Greedy and beam BLEU on the test split: the run's closing record."""
        if not self.cfg.eval.test_at_end:
            return None
        results = split_bleu(self.model, self.sp, *self.test_text, self.cfg.eval, self.ctx.dist, self.cfg.run.out_dir,
                             "test")
        return {"sentences": results["greedy"]["sentences"], **{f"bleu_{k}": v["bleu"] for k, v in results.items()},
                **{f"sent_per_s_{k}": v["sentences_per_s"] for k, v in results.items()}}


def train(cfg):
    return TranslationTrainer(cfg).fit()


def evaluate(cfg):
    """--eval-only: greedy and beam BLEU of a checkpoint on --split, written beside the checkpoint."""
    d = distributed.setup(cfg.run.device)
    ckpt = load_checkpoint(cfg.eval.eval_only, kind="translation")
    model, sp = Transformer.from_checkpoint(ckpt, d.device), load_sentencepiece(ckpt["spm"])
    data = cfg.data
    if not (data.data_dir or data.train_prefix or data.valid_prefix or data.test_prefix):
        data = from_dict(DataConfig, ckpt["config"]["data"])  # the files the run was trained with
    if d.master:
        print(f"{ckpt['path']}: step {ckpt['step']}, act {ckpt['model_config']['act']}", flush=True)
    autocast = autocast_for(d.device_type, cfg.run.dtype)
    with autocast:
        results = split_bleu(model, sp, *split_lines(data, cfg.eval.split), cfg.eval, d, Path(ckpt["path"]).parent,
                             cfg.eval.split)
    distributed.cleanup(d)
    return results


def main(argv):
    return run_cli(__doc__, TrainConfig, argv, lambda cfg: evaluate(cfg) if cfg.eval.eval_only else train(cfg))


if __name__ == "__main__":
    main(sys.argv[1:])
