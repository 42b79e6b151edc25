"""Train GPT-2 on token shards with any registered MLP activation.

    torchrun --standalone --nproc_per_node 8 train_gpt2.py --act aglu
    python train_gpt2.py --config configs/gpt2_cpu_tiny.toml --act nswish --max-steps 50
    python train_gpt2.py --config configs/gpt2_cpu_tiny.toml --resume      # continue the newest checkpoint
    python train_gpt2.py --init-from gpt2 --act aglu ...    # fine-tune OpenAI's GPT-2 with another activation

Every option is a field of TrainConfig below: set it in a TOML file (--config) or as --name value.
The loop itself (resume, logs, compile/DDP, checkpoints, signals) is training/loop.py, shared with
train_translation.py; this file holds what is GPT-2's own, top to bottom: its options, the model, the token
shards, the evaluations (the contract: training/loop.py's docstring).
"""
import contextlib
import os
import sys
from dataclasses import dataclass, field, replace
from typing import ClassVar
from pathlib import Path

import torch

from activations import micro_batch_note, mlp_activation, telemetry
from activations.anact import batch_mode
from activations.gated import width_note
from data.bits_per_byte import bits_per_byte, validation_bytes
from data.loader import ShardLoader, shards_tokenizer
from data.tokenizer import TOKENIZERS, VOCAB_SIZE, TokenizerError
from eval import internals, sparsity
from eval.core_in_loop import Core
from eval.hellaswag_in_loop import HellaSwag
from model import GPT, GPTConfig, mlp_width, mlp_width_args
from model_parts.transformers_layout import pretrained_gpt2
from training import distributed, fsdp, memory
from training.fsdp import DISTS
from training.checkpoint import load_checkpoint
from training.config import ConfigError, EvalConfig, RunConfig, run_cli, to_dict
from training.loop import Evaluation, Parts, Trainer, no_sync_unless, param_line
from training.optimizer import adamw
from training.schedule import warmup_cosine


@dataclass
class DataConfig:
    data_dir: str = "data/fineweb_edu"
    shuffle: bool = True  # shard order and sequence positions permuted per epoch, from the seed
    val_tokens: int = 10_485_760  # per validation, split over ranks: the same val set on any world size
    # (build-nanogpt's 20 steps x 8 GPUs x 64 x 1024)


@dataclass
class OptimConfig:
    total_batch_size: int = 524288  # tokens per optimizer step (2**19, ~0.5M as GPT-3 small)
    batch_size: int = 64  # micro-batch B per device; gradient accumulation fills the total
    seq_len: int = 1024
    max_lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 715
    max_steps: int = 19073  # 10B tokens / 2**19 tokens per step: one epoch of sample-10BT
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0

    # what a sweep's lr sets (sweep/plan.py), the lr itself first (run.json's `lr`): max_lr, and min_lr at the
    # config's min_lr / max_lr, so that the cosine schedule keeps its shape
    swept_lr: ClassVar[tuple] = ("max_lr", "min_lr")


@dataclass
class GPTEvalConfig(EvalConfig):
    hellaswag_interval: int = 0  # 0: off; else HellaSwag every N steps (at evaluation steps) and at the end
    hellaswag_data: str = ""  # "": download into the cache
    hellaswag_limit: int = 0  # 0: all 10,042 items
    core_bundle: str = ""  # "": off; else a DCLM/CORE bundle directory (eval/core.py), scored at every evaluation
    core_max_per_task: int = 0  # 0: every item of each task; else the first N of its shuffled order
    sample_interval: int = 0  # 0: off; else print 2 samples every N steps, between evaluations too (always at the end)

    # when, not what (samples draw from their own generator: the training RNG streams are untouched)
    resume_may_change: ClassVar[tuple] = (*EvalConfig.resume_may_change, "hellaswag_interval", "sample_interval")


@dataclass
class SpeedConfig:
    """How fast, not what: each option keeps the loss equal to the plain path (tests/test_speed.py,
    tests/test_train_gpt2.py) and none is stored in the model config, so a resumed run may change them.
    DDP safety: README. (torch.compile's mode is --compile-mode, shared with the translation trainer.)"""
    loss_chunks: int = 0  # 0: off; else LM head + cross-entropy in N row chunks, never the full fp32 logits
    attention_backend: str = "auto"  # SDPA kernel(s) on CUDA: auto, flash, cudnn, efficient, math or e.g. cudnn,flash

    resume_may_change: ClassVar[tuple] = ("loss_chunks", "attention_backend")


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: GPTEvalConfig = field(default_factory=GPTEvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    # "": random init. Else the weights to start from: a checkpoint (file or run directory; ours, build-nanogpt's
    # or nanoGPT's) or transformers GPT-2 (a directory, or a hub name: gpt2, gpt2-medium, openai-community/gpt2).
    # Its architecture replaces the model section's; act, act_kwargs, plain_top_k and dropout stay this run's (a
    # gated act needs a gated source: the MLP's form is architecture too).
    init_from: str = ""

    # model: resume_training compares the model's config itself; init_from: a resume does not read it
    resume_may_change: ClassVar[tuple] = ("model", "init_from")


# what --init-from takes from the source model (glu_hidden, norm and the parametrization: absent from older sources,
# which are plain LayerNorm GPT-2s in sp: 0, "layernorm", "sp"); the parametrization's multipliers are part of the
# function its weights compute. The rest of the model section is the run's own
ARCHITECTURE = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias", "glu_hidden", "norm", "param",
                "base_width", "base_depth", "pos_emb")


def architecture(model_config):
    return {k: model_config.get(k, getattr(GPTConfig(), k)) for k in ARCHITECTURE}


def steps_per_rank(total, batch_size, seq_len, world_size, name="total_batch_size"):
    """How many (B, T) batches each rank runs so that all ranks together cover `total` tokens."""
    per_pass = batch_size * seq_len * world_size
    if total % per_pass or total == 0:
        raise ConfigError(f"{name} {total} is not divisible by batch_size*seq_len*world_size = "
                          f"{batch_size}*{seq_len}*{world_size} = {per_pass}; change --{name.replace('_', '-')} "
                          "or --batch-size")
    return total // per_pass


class GPTTrainer(Trainer):
    """The model (GPT-2 with the run's activation), the token shards with gradient accumulation, and the
    evaluations: validation loss, activation telemetry, HellaSwag, CORE and samples at their intervals."""
    kind = "gpt2"
    shards = True
    lr_flag = "--max-lr"
    in_loop = (HellaSwag, Core)  # beside the val loss (training/in_loop.py): a new evaluation is one file and one entry

    def build(self, ctx, ckpt):
        cfg, d, o = self.cfg, ctx.dist, self.cfg.optim
        self.ctx = ctx
        self.accum = steps_per_rank(o.total_batch_size, o.batch_size, o.seq_len, d.world_size)
        self.val_steps = steps_per_rank(cfg.data.val_tokens, o.batch_size, o.seq_len, d.world_size, "val_tokens")
        source = None
        if cfg.init_from and ckpt is None:
            source = read_init_source(cfg.init_from)
            cfg.model = replace(cfg.model, **architecture(source[1]))
        elif cfg.init_from:  # a resumed run continues its checkpoint, whose architecture came from the source
            cfg.model = replace(cfg.model, **architecture(ckpt["model_config"]))
            if d.master:
                print(f"--init-from {cfg.init_from} not read: the run resumes its own checkpoint", flush=True)
        if d.device_type == "cuda":  # a run that cannot fit its GPU stops here, in one line, before it allocates
            reason = memory.refusal(memory_shape(cfg.model), o.batch_size, o.seq_len, cfg.run.dist,
                                    shard_group(cfg, d),
                                    ctx.precision, cfg.run.activation_checkpointing, cfg.speed.loss_chunks,
                                    torch.cuda.get_device_properties(d.device).total_memory,
                                    torch.cuda.get_device_name(d.device))
            if reason:
                raise ConfigError(reason)
        # the model before the data: a bad activation, option or speed setting fails first
        self.model, origin = build_model(cfg, ctx, source)
        self.tokenizer, unknown = shards_tokenizer(cfg.data.data_dir)
        if self.tokenizer:
            check_vocab(self.tokenizer, cfg.model.vocab_size, cfg.data.data_dir, d.master)
        self.loader = ShardLoader(cfg.data.data_dir, "train", o.batch_size, o.seq_len, d.rank, d.world_size,
                                  seed=cfg.run.seed, shuffle=cfg.data.shuffle, vocab_size=cfg.model.vocab_size)
        self.val_loader = ShardLoader(cfg.data.data_dir, "val", o.batch_size, o.seq_len, d.rank, d.world_size,
                                      shuffle=False, vocab_size=cfg.model.vocab_size)
        self.val_bytes = None
        if self.tokenizer:
            self.val_bytes = validation_bytes(cfg.data.data_dir, self.tokenizer, o.batch_size * d.world_size,
                                              o.seq_len, self.val_steps)
        if d.master:
            print(f"val bits per byte: {cfg.data.val_tokens:,} target tokens of {self.val_bytes:,} bytes "
                  f"({self.tokenizer.name})" if self.tokenizer else f"no val bits per byte: {unknown}", flush=True)
        self.device_name = torch.cuda.get_device_name() if d.device_type == "cuda" else None
        return Parts(model=self.model, loader=self.loader, max_steps=o.max_steps, model_config=to_dict(cfg.model),
                     flops_per_token=self.model.flops_per_token(o.seq_len),
                     optimizer=adamw(self.model, o.max_lr, o.weight_decay, o.betas, o.eps, d.device_type,
                                     self.model.optimizer_groups(o.weight_decay, o.eps)),
                     mlp_shape=(o.batch_size * o.seq_len, mlp_width(cfg.model)), origin=origin,
                     params=self.model.param_counts(), accum=self.accum,
                     description=f"{param_line(self.model.param_counts())}{width_note(*mlp_width_args(cfg.model))} | "
                                 f"act {cfg.model.act} | {parametrization_note(self.model)}"
                                 f"grad accum {self.accum}{micro_batch_note(self.model, self.accum * d.world_size)}")

    def learning_rate(self, step):
        o = self.cfg.optim
        return warmup_cosine(step, o.warmup_steps, o.max_steps, o.max_lr, o.min_lr)

    def forward_backward(self, model, seed_micro_batch):
        device, loss_sum = self.ctx.dist.device, torch.zeros((), device=self.ctx.dist.device)
        for micro in range(self.accum):
            seed_micro_batch(micro)
            x, y = self.loader.next_batch()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with no_sync_unless(micro == self.accum - 1, model):
                with self.ctx.autocast:
                    _, loss = model(x, y)
                    loss = loss / self.accum
                loss_sum += loss.detach()
                self.ctx.scaler.scale(loss).backward()
        return loss_sum, self.accum * x.numel()

    def step_fields(self, tok_per_s):
        mfu = self.model.estimate_mfu(tok_per_s / self.ctx.dist.world_size, self.cfg.optim.seq_len, self.device_name)
        return {"mfu": mfu}

    def evaluate(self, step, last, model):
        """Validation loss (on `model`: compiled when compile is on) and activation telemetry on the first
        validation batch (HellaSwag is an in-loop evaluation: eval/hellaswag_in_loop.py)."""
        d = self.ctx.dist
        val = self.validation_loss(model)
        result = Evaluation({"val_loss": val}, f"val loss {val:.4f}", {"val": val})
        if self.val_bytes:
            bpb = bits_per_byte(val, self.cfg.data.val_tokens, self.val_bytes)
            result.fields["val_bpb"] = bpb
            result.text += f" bpb {bpb:.4f}"
        model = self.model
        if fsdp.sharded_root(model) is not None:  # these read modules one by one: a whole copy on rank 0
            state = fsdp.whole_model_state(model)
            model = GPT.from_checkpoint({"model_config": to_dict(self.cfg.model), "model": state}, d.device)\
                if d.master else None
        if d.master:
            self.val_loader.reset()
            batch = self.val_loader.next_batch()[0][:telemetry.MAX_ROWS].to(d.device)
            result.fields["telemetry"] = telemetry.collect(model, batch, self.ctx.autocast)
            # the literature's one-batch measurements (eval/measure.py runs them all, CETT and PPL-p% included)
            result.fields["measure"] = {"sparsity": sparsity.on_batch(model, batch, self.ctx.autocast),
                                        **internals.measure(model, batch, self.ctx.autocast)}
        return result

    @torch.no_grad()
    def validation_loss(self, model):
        d = self.ctx.dist

        def loss_sum():
            total = torch.zeros((), device=d.device)
            for _ in range(self.val_steps):
                x, y = self.val_loader.next_batch()
                with self.ctx.autocast:
                    _, loss = model(x.to(d.device), y.to(d.device))
                total += loss.detach()
            return total

        model.eval()
        self.val_loader.reset()
        total = distributed.before_collective(loss_sum, d)  # an OOM on one rank: all fail here, none waits below
        model.train()
        return distributed.all_reduce_mean(total / self.val_steps, d).item()

    def after_step(self, step):
        every = self.cfg.eval.sample_interval
        if every and step % every == 0 and step < self.cfg.optim.max_steps:  # the last step's come from finish
            self.print_samples(step)

    def finish(self, step):
        self.print_samples(step)

    def print_samples(self, step):
        d = self.ctx.dist
        # shards without a manifest: GPT-2 tokens (build-nanogpt's, llm.c's), unless the model is too small for
        # them (tests' synthetic data)
        tokenizer = self.tokenizer or (TOKENIZERS["gpt2"] if self.cfg.model.vocab_size >= VOCAB_SIZE else None)
        if tokenizer is None:
            return
        try:
            prompt = tokenizer.encode("Hello, I'm a language model,")
        except TokenizerError as e:  # offline without TIKTOKEN_CACHE_DIR: samples are optional
            print(f"(no samples: {e})")
            return
        # an own generator: the training RNG streams (and so resume) stay untouched
        gen = torch.Generator(device=d.device).manual_seed(self.cfg.run.seed + d.rank)
        self.model.eval()
        with self.ctx.autocast:
            # 24 GPT-2 tokens, or about as much text in bytes (~4.3 a token)
            out = self.model.generate(torch.tensor(prompt, device=d.device).repeat(2, 1),
                                      24 if tokenizer.name == "gpt2" else 100, top_k=50, generator=gen)
        self.model.train()
        for row in out.tolist():
            print(f"step {step} rank {d.rank} sample: {tokenizer.decode(row)!r}", flush=True)


def build_model(cfg, ctx, source):
    """(the run's GPT on its device, where its weights came from). --dist fsdp on several ranks: sharded per block,
    the tied embedding and head in one group (training/fsdp.py); from scratch it is built on the meta device and
    each rank draws only its shards' worth of memory, the same weights as a plain build."""
    d = ctx.dist
    sharded = cfg.run.dist in fsdp.SHARDED and d.world_size > 1
    if sharded and cfg.eval.core_bundle:  # its ranks score different numbers of rows: FSDP would wait
        raise ConfigError("--core-bundle with --dist fsdp: score the run's checkpoints with eval/core.py instead, or "
                          "train with --core-bundle ''")

    def make():
        return GPT(cfg.model, cfg.speed.loss_chunks, cfg.speed.attention_backend, seed=cfg.run.init_seed)

    with fsdp.meta_init() if sharded and source is None else contextlib.nullcontext():
        model = make()
    if cfg.run.activation_checkpointing:
        if batch_mode(model):
            raise ConfigError(f"--activation-checkpointing with act {cfg.model.act}: the recomputed forward would "
                              "count its batch statistics twice; train it without")
        for block in model.transformer.h:
            fsdp.checkpoint_activations(block)
    small = fsdp.real_tensors(model) if sharded and source is None else None
    if small is None:
        model.to(d.device)
    origin = init_weights(model, *source) if source is not None else "starting from scratch"
    if sharded:
        fsdp.shard(model, [*model.transformer.h, [model.transformer.wte, model.lm_head]], ctx.precision, d.device,
                   d.world_size, shard_group(cfg, d))
        if small is not None:
            fsdp.materialize(model, small, cfg.run.init_seed, model._init_weight, d.device)
    return model, origin


def shard_group(cfg, d):
    """The ranks the model is sharded over (training/fsdp.py's shard_group_size: a node's under --dist hsdp)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", d.world_size))  # torchrun's processes on this node
    return fsdp.shard_group_size(cfg.run.dist, d.world_size, local)


def memory_shape(config):
    """training/memory.py's ModelShape of a GPTConfig, counted on a 1-layer model on the meta device (a 1.5B
    model's 48 blocks take a CPU-second to build there): the other blocks are the first's size, but for an
    activation's scalars (plain_top_k's)."""
    with torch.device("meta"):
        model = GPT(replace(config, n_layer=1), seed=0)
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    return memory.ModelShape(sum(p.numel() for p in model.parameters()) + (config.n_layer - 1) * block,
                             max(block, model.transformer.wte.weight.numel()), config.n_layer, config.n_embd,
                             mlp_width(config), mlp_activation(config.act)[1], config.vocab_size)


def memory_estimates(cfg, world_size, shape=None):
    """{dist: training/memory.py's Estimate per GPU} of a TrainConfig's run on `world_size` ranks under --dist ddp
    and fsdp, in bfloat16 where its dtype is auto (CUDA's): what the sweep's cost table prints. shape: the model's
    memory_shape, when the caller has it."""
    shape = shape or memory_shape(cfg.model)
    precision = "bfloat16" if cfg.run.dtype in ("auto", "bfloat16") else cfg.run.dtype
    return {dist: memory.estimate(shape, cfg.optim.batch_size, cfg.optim.seq_len, dist, world_size, precision,
                                  cfg.run.activation_checkpointing, cfg.speed.loss_chunks) for dist in DISTS[:2]}


def parametrization_note(model):
    """The start line's word on the parametrization: '' under sp, else its multipliers."""
    c = model.config
    if c.param == "sp":
        return ""
    p = model.parametrization
    depth = f", m_depth {p.m_depth:g} (base n_layer {c.base_depth})" if c.param == "completep" else ""
    return f"param {c.param}: m_width {p.m_width:g} (base n_embd {c.base_width}){depth} | "


def check_vocab(tokenizer, vocab_size, data_dir, master):
    """The model must have a row for every token id of the shards; rows beyond them (padded to a multiple of 64,
    as GPT-2's 50304) are output-layer compute that no target ever uses, said in one line."""
    padded = -(-tokenizer.vocab_size // 64) * 64
    if vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"{data_dir} holds {tokenizer.name} tokens (ids up to {tokenizer.vocab_size - 1:,}) but the "
                          f"model's vocab_size is {vocab_size:,}; set --vocab-size {padded}")
    if vocab_size > padded and master:
        print(f"note: the model's vocab_size {vocab_size:,} is more than the {tokenizer.name} shards in {data_dir} "
              f"need: {vocab_size - tokenizer.vocab_size:,} output rows no target uses; --vocab-size {padded} "
              "spends that compute in the blocks instead", flush=True)


def read_init_source(name):
    """--init-from NAME -> (state dict in our layout, the source's model config, what it is)."""
    path = Path(name)
    if path.suffix == ".pt" or (path.exists() and not (path / "config.json").is_file()):
        ckpt = load_checkpoint(path, kind="gpt2")
        return ckpt["model"], ckpt["model_config"], f"{ckpt['path']} (step {ckpt['step']})"
    architecture, state = pretrained_gpt2(name)
    return state, {**architecture, "act": "gelu", "act_kwargs": {}, "plain_top_k": 0}, f"transformers GPT-2 {name}"


def init_weights(model, state, source_config, what):
    """Load the source's weights into the new model. Another activation keeps every other weight (MLP
    matrices included) and starts its own parameters at their init; returns the line saying so."""
    config = to_dict(model.config)
    theirs, ours = source_config.get("act", "gelu"), config["act"]
    if mlp_activation(theirs)[1] != mlp_activation(ours)[1]:
        forms = {True: "gated", False: "plain"}
        raise ConfigError(f"--init-from {what}: its MLP is {forms[mlp_activation(theirs)[1]]} (act {theirs}) and this "
                          f"run's is {forms[mlp_activation(ours)[1]]} (act {ours}): a gated MLP has a third matrix "
                          "(c_up) at another width, so no MLP weight carries over; start from a source with the same "
                          "MLP form, or from scratch")
    same_act = all(source_config.get(k, 0) == config[k] for k in ("act", "plain_top_k"))
    kept = {k: v for k, v in state.items() if same_act or ".mlp.act." not in k}
    ours = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(ours[k].shape)}" for k, v in kept.items() if k in ours and
             v.shape != ours[k].shape]
    if wrong:
        raise ConfigError(f"--init-from {what}: its weights do not fit this model: {wrong[:2]} (e.g. channelwise "
                          "activation options that differ from the source's)")
    missing, unexpected = model.load_state_dict(kept, strict=False)
    missing = [k for k in missing if ".mlp.act." not in k]
    if missing or unexpected:
        raise ConfigError(f"--init-from {what}: not a GPT-2 of this layout (missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]})")
    act = (f"activation {config['act']} and its parameters kept" if same_act else
           f"activation {source_config.get('act')} -> {config['act']}: MLP weights kept, its parameters at their init")
    return f"initialised from {what}: {act}; optimizer starts fresh"


def train(cfg):
    return GPTTrainer(cfg).fit()


def main(argv):
    return run_cli(__doc__, TrainConfig, argv, train)


if __name__ == "__main__":
    main(sys.argv[1:])
