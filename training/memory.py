"""What one training run holds per GPU, before it starts: parameters, gradients, AdamW's two moments and the
activations of one micro-batch, under --dist ddp (every rank holds the whole model) and --dist fsdp (the model's
states sharded over the ranks, training/fsdp.py). The plan's dry run and cost line print it (sweep/cost.py), and a
run refuses to start on a GPU it cannot fit (train_gpt2.py).

Bytes, for N parameters (the tied embedding once), W ranks, a micro-batch of B sequences of T tokens, width C,
L layers, MLP width F, vocabulary V:
- states: float32 parameters 4N, gradients 4N, AdamW's moments 8N (Adam's exp_avg and exp_avg_sq); DDP adds its
  gradient buckets, another 4N, on several ranks. FSDP divides the 16N by W and adds what one rank gathers whole
  at once: the two largest groups (the one computing and the one prefetched) in the compute dtype, and the
  computing group's unsharded gradients in float32 before their reduce-scatter. Under --dist hsdp W is the ranks
  of a node, which the model is sharded over (the nodes hold replicas): a GPU holds what FSDP on W ranks holds.
- activations: what backward keeps per layer and token (Korthikanti et al. 2022, sec. 4.1, without attention
  scores, which flash/SDPA recompute): the two norms' inputs and outputs, q, k, v, the attention output and
  c_proj's input (9C), the MLP's input to the activation and its output (2F; a gated MLP's up projection and
  product add 2F); in the compute dtype (2 bytes under bfloat16, 4 in float32). With activation checkpointing a
  layer keeps only its input (C), and one layer's whole set is live in its backward. The output layer keeps its
  logits and their log-softmax in float32, and its backward adds the gradients of both: 16 BTV bytes in float32;
  12 under bfloat16 autocast (bfloat16 logits, one float32 copy, two gradients of which one is bfloat16); a
  1/loss_chunks share of it with --loss-chunks.
The measured peak of a CPU run against this estimate: BENCHMARKS.md, "FSDP2".
"""
from dataclasses import dataclass

ADAM_MOMENTS = 2
GIB = 2 ** 30


@dataclass
class Estimate:
    params: float  # bytes per GPU
    grads: float
    optimizer: float
    gathered: float  # FSDP: groups all-gathered whole at once (and their unsharded gradients); DDP: its buckets
    activations: float
    sharded: bool = False  # gathered is FSDP's gathered groups (else DDP's gradient buckets)

    @property
    def total(self):
        return self.params + self.grads + self.optimizer + self.gathered + self.activations

    def line(self):
        return (f"{self.total / GIB:.1f} GiB (params {self.params / GIB:.1f}, grads {self.grads / GIB:.1f}, AdamW "
                f"{self.optimizer / GIB:.1f}, {'gathered' if self.sharded else 'buckets'} {self.gathered / GIB:.1f}, "
                f"activations {self.activations / GIB:.1f})")


@dataclass
class ModelShape:
    """What the estimate needs of a model (a trainer counts it: train_gpt2.py's memory_shape)."""
    params: int  # all parameters, a tied one once
    largest_group: int  # the largest FSDP group's parameters (a block, or the tied embedding)
    n_layer: int
    n_embd: int
    mlp_width: int
    gated: bool
    vocab_size: int


def estimate(shape, batch_size, seq_len, dist="ddp", world_size=1, precision="float32", checkpointing=False,
             loss_chunks=0):
    """The Estimate per GPU of training a model of `shape` (ModelShape) at micro-batch (batch_size, seq_len)."""
    n, group = shape.params, shape.largest_group
    low = 2 if precision in ("bfloat16", "float16") else 4
    sharded = dist in ("fsdp", "hsdp") and world_size > 1
    share = world_size if sharded else 1
    if sharded:
        gathered = 2 * group * low + 4 * group
    else:
        gathered = 4 * n if world_size > 1 else 0  # DDP's gradient buckets
    C, L, V, F = shape.n_embd, shape.n_layer, shape.vocab_size, shape.mlp_width
    per_token_layer = (9 * C + (4 if shape.gated else 2) * F) * low
    tokens = batch_size * seq_len
    layers = (L * C * low + per_token_layer) * tokens if checkpointing else L * per_token_layer * tokens
    logits = (16 if low == 4 else 12) * tokens * V / max(loss_chunks, 1)
    return Estimate(4 * n / share, 4 * n / share, ADAM_MOMENTS * 4 * n / share, gathered, layers + logits, sharded)


def refusal(shape, batch_size, seq_len, dist, world_size, precision, checkpointing, loss_chunks, capacity,
            device_name):
    """None when the estimate fits `capacity` bytes, else the one-line reason and what would fit."""
    need = estimate(shape, batch_size, seq_len, dist, world_size, precision, checkpointing, loss_chunks)
    if need.total <= capacity:
        return None
    hints = []
    if dist == "ddp" and world_size > 1:
        fsdp = estimate(shape, batch_size, seq_len, "fsdp", world_size, precision, checkpointing, loss_chunks)
        hints.append(f"--dist fsdp needs {fsdp.total / GIB:.1f} GiB")
    if not checkpointing:
        recomputed = estimate(shape, batch_size, seq_len, dist, world_size, precision, True, loss_chunks)
        hints.append(f"--activation-checkpointing {recomputed.total / GIB:.1f} GiB")
    hints.append("a lower --batch-size (gradient accumulation keeps the tokens per step)")
    return (f"this run needs about {need.line()} per GPU under --dist {dist} on {world_size} ranks, more than the "
            f"{capacity / GIB:.1f} GiB of {device_name}; {'; '.join(hints)} (training/memory.py)")
