"""Train a DeepNorm encoder-decoder Transformer on IWSLT De-En with any registered FFN activation; BLEU.

    python train_translation.py --config configs/translation_6l.toml --act swish          # HF IWSLT 2017
    python train_translation.py --config configs/translation_12l.toml --act nswish \\
        --act-kwargs '{"per_instance": true}' --plain-top-k 1                               # NSwish + 1 Swish
    python train_translation.py --config configs/translation_cpu_small.toml --data-dir DIR  # train.de, valid.en ...
    torchrun --standalone --nproc_per_node 4 train_translation.py --config configs/translation_6l.toml
    python train_translation.py --eval-only log/translation_6l/model_20000.pt --split test --beam 5

Every option is a field of TrainConfig below: set it in a TOML file (--config) or as --name value.
--resume continues the newest checkpoint in --out-dir exactly (optimizer, data order, RNG streams).
"""
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data.parallel import DataError, TokenBatchLoader, encode, load_sentencepiece, load_split, sentencepiece_model
from eval import telemetry
from eval.bleu import corpus_bleu
from harness import distributed
from harness.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, resume_training,
                                save_training_checkpoint)
from harness.config import ConfigError, RunConfig, from_dict, help_text, load_config, to_dict
from harness.runlog import RunLog, environment
from harness.schedule import inverse_sqrt
from harness.stop import GracefulStop
from harness.training import autocast_context, resolve_precision, stop_if_not_finite
from translation.decode import translate
from translation.model import Transformer, TranslationConfig


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
    max_tokens: int = 4096  # per batch and process: sentences * longest side
    max_sentences: int = 0  # per batch and process (0: no limit; the paper's batches are 128-256 sentences)


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


@dataclass
class EvalConfig:
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


@dataclass
class TrainConfig:
    model: TranslationConfig = field(default_factory=TranslationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="log/translation", eval_interval=1000,
                                                            checkpoint_interval=2000, log_interval=50))


def split_lines(data, split):
    prefix = {"train": data.train_prefix, "valid": data.valid_prefix, "test": data.test_prefix}[split]
    return load_split(split, data.src_lang, data.tgt_lang, data.data_dir, prefix, data.hf_dataset, data.hf_config)


def tokenizer(cfg, d, src, tgt):
    """The run's sentencepiece model (bytes): rank 0 trains or finds it in the cache, the others then read it."""
    cache = cfg.data.spm_dir or cfg.run.out_dir
    args = (src, tgt, cfg.data.spm_vocab_size, cfg.data.spm_type, cache)
    model = sentencepiece_model(*args) if d.master else None
    if d.ddp:
        dist.barrier()
        model = model or sentencepiece_model(*args)
    return model


@torch.no_grad()
def validation_loss(model, loader, d, autocast):
    """Token-level cross-entropy (no label smoothing) over the whole validation set, all ranks."""
    model.eval()
    total = torch.zeros(2, device=d.device)
    for x, y_in, y_out in loader:
        x, y_in, y_out = x.to(d.device), y_in.to(d.device), y_out.to(d.device)
        with autocast:
            logits = model(x, y_in)
        n = (y_out != model.cfg.pad_id).sum()
        total += torch.stack([model.loss(logits, y_out) * n, n.float()])
    model.train()
    total = distributed.all_reduce_mean(total, d)
    return (total[0] / total[1]).item()


def decode_cost(n, seconds):
    return f"{n} sentences in {seconds:.1f}s = {n / max(seconds, 1e-9):.1f} sent/s"


def bleu_of(model, sp, src, ref, ecfg, d, beam, progress=False):
    """Translate src (split over ranks), gather, score: (BLEU, signature, hypotheses, decode seconds) on
    every rank."""
    t0 = time.time()
    mine = translate(model, sp, src[d.rank::d.world_size], beam, ecfg.len_penalty, ecfg.max_len_a, ecfg.max_len_b,
                     ecfg.decode_batch, d.device, progress and d.master)
    parts = distributed.gather_objects(mine, d)
    hyps = [None] * len(src)
    for r, part in enumerate(parts):
        hyps[r::d.world_size] = part
    seconds = time.time() - t0
    score, signature = corpus_bleu(hyps, ref)
    return score, signature, hyps, seconds


def periodic_eval(step, model, sp, val_loader, valid_text, tokens, cfg, d, autocast, log):
    """Validation loss on the whole valid split, greedy BLEU on its first --bleu-sentences sentences and
    activation telemetry; logged as `val` / `bleu` lines and one `eval` record. Returns (loss, BLEU)."""
    val = validation_loss(model, val_loader, d, autocast)
    fields, bleu = {"val_loss": val}, None
    if step > 0:  # an untrained model's BLEU is 0 and its greedy outputs run to the length cap
        n = cfg.eval.bleu_sentences or len(valid_text[0])
        with autocast:
            bleu, _, _, seconds = bleu_of(model, sp, valid_text[0][:n], valid_text[1][:n], cfg.eval, d, 1)
        log.scalar(step, "bleu", bleu)
        fields.update(bleu=bleu, bleu_sentences=n, bleu_seconds=seconds)
    if d.master:  # per-layer activation statistics on a mid-length validation batch (eval/telemetry.py)
        x, y_in, _ = val_loader.batch(len(val_loader) // 2)
        fields["telemetry"] = telemetry.collect(model, (x.to(d.device), y_in.to(d.device)), autocast)
        print(f"step {step:5d} | val loss {val:.4f}" + (f" | valid BLEU (greedy) {bleu:.2f} | {decode_cost(n, seconds)}"
                                                        if step else ""), flush=True)
    log.scalar(step, "val", val)
    log.record(step, kind="eval", tokens=tokens, **fields)
    return val, bleu


def split_bleu(model, sp, data, ecfg, d, out_dir, split):
    """Greedy and beam BLEU on the first --test-sentences sentences of a split (0: all) and the decoding
    speed; translations and scores written to out_dir."""
    src, ref = split_lines(data, split)
    total = len(src)
    n = min(ecfg.test_sentences or total, total)
    src, ref = src[:n], ref[:n]
    subset = "" if n == total else f" (first {n} of {total} sentences)"
    results = {}
    for beam in sorted({1, ecfg.beam}):
        name = "greedy" if beam == 1 else f"beam{beam}"
        score, signature, hyps, seconds = bleu_of(model, sp, src, ref, ecfg, d, beam, progress=True)
        results[name] = {"bleu": score, "signature": signature, "sentences": n, "of": total,
                         "seconds": round(seconds, 2), "sentences_per_s": round(n / max(seconds, 1e-9), 2)}
        if d.master:
            Path(out_dir, f"translations_{split}_{name}.txt").write_text("\n".join(hyps) + "\n")
            print(f"{split} BLEU ({name}) = {score:.2f}{subset}  {signature} | {decode_cost(n, seconds)}", flush=True)
    if d.master:
        Path(out_dir, f"bleu_{split}.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def train(cfg):
    d = distributed.setup(cfg.run.device)
    torch.manual_seed(cfg.run.seed)
    o, mcfg = cfg.optim, cfg.model
    precision = resolve_precision(cfg.run.dtype, d.device_type)
    autocast = autocast_context(d.device_type, precision)
    use_compile = d.device_type == "cuda" if cfg.run.compile is None else cfg.run.compile

    ckpt_path = latest_checkpoint(cfg.run.out_dir) if cfg.run.resume else None
    ckpt = load_checkpoint(ckpt_path, kind="translation") if ckpt_path else None
    train_src, train_tgt = split_lines(cfg.data, "train")
    spm_bytes = ckpt["spm"] if ckpt else tokenizer(cfg, d, train_src, train_tgt)
    sp = load_sentencepiece(spm_bytes)
    mcfg = dataclasses.replace(mcfg, vocab_size=mcfg.vocab_size or sp.get_piece_size())
    if mcfg.vocab_size != sp.get_piece_size():
        raise ConfigError(f"vocab_size {mcfg.vocab_size} differs from the sentencepiece model's "
                          f"{sp.get_piece_size()}; leave vocab_size at 0 to take it from the tokenizer")
    if (mcfg.pad_id, mcfg.bos_id, mcfg.eos_id) != (sp.pad_id(), sp.bos_id(), sp.eos_id()):
        raise ConfigError(f"pad/bos/eos ids {mcfg.pad_id}/{mcfg.bos_id}/{mcfg.eos_id} differ from the sentencepiece "
                          f"model's {sp.pad_id()}/{sp.bos_id()}/{sp.eos_id()}; leave them at their defaults")
    train_ids = encode(sp, train_src, train_tgt, cfg.data.max_len)
    valid_src, valid_ref = split_lines(cfg.data, "valid")
    valid_ids = encode(sp, valid_src, valid_ref, mcfg.max_positions - 1)
    loader = TokenBatchLoader(*train_ids, cfg.data.max_tokens, cfg.data.max_sentences, d.rank, d.world_size,
                              seed=cfg.run.seed)
    val_loader = TokenBatchLoader(*valid_ids, cfg.data.max_tokens, 0, d.rank, d.world_size, shuffle=False)
    max_steps = o.max_steps or o.epochs * len(loader)

    model = Transformer(mcfg).to(d.device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=o.lr, betas=o.betas, eps=o.eps)
    start_step, tokens = 0, 0
    if ckpt is not None:
        start_step = resume_training(ckpt, dataclasses.asdict(mcfg), d.world_size, d.rank, model, optimizer, loader)
        tokens = ckpt["tokens"]
    log = RunLog(cfg.run.out_dir, d.master, resume_step=start_step if ckpt else None, tensorboard=cfg.run.tensorboard)
    log.write_run_info(to_dict(cfg), environment(d))
    if d.master:
        where = f"resuming {ckpt_path} at step {start_step}" if ckpt else "starting from scratch"
        print(f"{model.num_params() / 1e6:.2f}M parameters | act {mcfg.act} (plain top {mcfg.plain_top_k}) | "
              f"{mcfg.norm} {mcfg.enc_layers}-{mcfg.dec_layers} | vocab {mcfg.vocab_size} | "
              f"{len(train_ids[0])} train pairs (of {len(train_src)}, max len {cfg.data.max_len}) | "
              f"{len(loader)} steps/epoch | {max_steps} steps | world {d.world_size} | {precision} | {where}",
              flush=True)

    raw_model = model
    if use_compile:
        model = torch.compile(model, dynamic=True)  # batch shapes vary with sentence lengths
    if d.ddp:
        model = DDP(model, device_ids=[d.local_rank] if d.device_type == "cuda" else None)
    stop = GracefulStop()
    try:
        step, val, bleu, stopping = start_step, None, None, False
        while True:
            last = step == max_steps
            if step % cfg.run.eval_interval == 0 or last:
                val, bleu = periodic_eval(step, raw_model, sp, val_loader, (valid_src, valid_ref), tokens, cfg, d,
                                          autocast, log)
            if last:
                break

            t0 = time.time()
            lr = inverse_sqrt(step, o.warmup_steps, o.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y_in, y_out = loader.next_batch(d.device)
            with autocast:
                loss = raw_model.loss(model(x, y_in), y_out, o.label_smoothing)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            stats = distributed.all_reduce_mean(torch.stack([loss.detach(), (y_out != mcfg.pad_id).sum().float()]), d)
            loss_value, step_tokens = stats[0].item(), round(stats[1].item() * d.world_size)
            stop_if_not_finite(step, loss_value, norm.item(), lr, raw_model, cfg.run.out_dir, "--lr")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if d.device_type == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
            tokens += step_tokens
            if d.master and step % cfg.run.log_interval == 0:
                print(f"step {step:5d} | epoch {loader.epoch} | loss {loss_value:.4f} | lr {lr:.4e} | "
                      f"norm {norm.item():.3f} | dt {1000 * dt:.0f}ms | tgt tok/sec {step_tokens / dt:.0f}", flush=True)
            log.scalar(step, "train", loss_value)
            log.record(step, kind="train", loss=loss_value, lr=lr, grad_norm=norm.item(), dt_ms=1000 * dt,
                       tok_per_s=step_tokens / dt, tokens=tokens, epoch=loader.epoch)
            step += 1

            stopping = distributed.any_rank(stop.requested, d)
            if step % cfg.run.checkpoint_interval == 0 or step == max_steps or stopping:
                state = {"kind": "translation", "model": raw_model.state_dict(),
                         "model_config": dataclasses.asdict(mcfg), "config": to_dict(cfg),
                         "optimizer": optimizer.state_dict(), "tokens": tokens, "val_loss": val, "bleu": bleu,
                         "spm": spm_bytes}
                save_training_checkpoint(state, loader, d, cfg.run.out_dir, step, cfg.run.keep_checkpoints)
            if stopping:
                break
        if cfg.eval.test_at_end and not stopping:
            try:
                results = split_bleu(raw_model, sp, cfg.data, cfg.eval, d, cfg.run.out_dir, "test")
                log.record(step, kind="test", sentences=results["greedy"]["sentences"],
                           **{f"bleu_{k}": v["bleu"] for k, v in results.items()},
                           **{f"sent_per_s_{k}": v["sentences_per_s"] for k, v in results.items()})
            except DataError as e:
                if d.master:
                    print(f"no test BLEU: {e}", flush=True)
    finally:  # also on a NaN stop or an exception: leave signal handlers and the process group as found
        stop.close()
        log.close()
        distributed.cleanup(d)
    return raw_model


def load_translation_model(path, device="cpu"):
    """(model in eval mode, sentencepiece processor, checkpoint) from a translation checkpoint or run dir."""
    ckpt = load_checkpoint(path, kind="translation")
    model = Transformer(TranslationConfig(**ckpt["model_config"])).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), load_sentencepiece(ckpt["spm"]), ckpt


def evaluate(cfg):
    """--eval-only: greedy and beam BLEU of a checkpoint on --split, written beside the checkpoint."""
    d = distributed.setup(cfg.run.device)
    model, sp, ckpt = load_translation_model(cfg.eval.eval_only, d.device)
    data = cfg.data
    if not (data.data_dir or data.train_prefix or data.valid_prefix or data.test_prefix):
        data = from_dict(DataConfig, ckpt["config"]["data"])  # the files the run was trained with
    if d.master:
        print(f"{ckpt['path']}: step {ckpt['step']}, act {ckpt['model_config']['act']}", flush=True)
    autocast = autocast_context(d.device_type, resolve_precision(cfg.run.dtype, d.device_type))
    with autocast:
        results = split_bleu(model, sp, data, cfg.eval, d, Path(ckpt["path"]).parent, cfg.eval.split)
    distributed.cleanup(d)
    return results


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__ + "\noptions (default):\n" + help_text(TrainConfig))
        return
    try:
        cfg = load_config(TrainConfig, argv)
        return evaluate(cfg) if cfg.eval.eval_only else train(cfg)
    except (ConfigError, CheckpointError, DataError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
