"""Speed options of the GPT-2 step keep the loss and every gradient of the plain path: the chunked
LM head + cross-entropy (eager, fp16 autocast with a GradScaler, bf16 autocast, torch.compile), the SDPA
backend choice, bad values."""
import copy

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, sdpa_backends
from model_parts.chunked_loss import linear_cross_entropy

TINY = dict(block_size=16, vocab_size=96, n_layer=2, n_head=2, n_embd=32)
# The model of tests/test_train_gpt2.py's compiled run.
TRAINER_MODEL = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, act="aglu")


def loss_and_grads(model, idx, targets, autocast=None, scaler=None):
    """scaler: a float16 run's GradScaler, which scales the loss; the gradients come back unscaled."""
    model.zero_grad(set_to_none=True)
    with autocast or torch.autocast("cpu", enabled=False):
        _, loss = model(idx, targets)
    (scaler.scale(loss) if scaler else loss).backward()
    scale = scaler.get_scale() if scaler else 1.0
    prefix = "_orig_mod."  # torch.compile's wrapper
    return loss.detach(), {n.removeprefix(prefix): p.grad / scale for n, p in model.named_parameters()}


def pair(dtype=torch.float32, chunks=3, config=TINY, batch_size=3, **options):
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**config), seed=0).to(dtype)
    fast = GPT(GPTConfig(**config), loss_chunks=chunks, **options, seed=0).to(dtype)
    fast.load_state_dict(plain.state_dict())
    vocab = config["vocab_size"]
    idx, targets = torch.randint(0, vocab, (batch_size, 16)), torch.randint(0, vocab, (batch_size, 16))
    targets[0, :5] = -1  # ignored positions, as the trainer's ignore_index
    return plain, fast, idx, targets


def test_linear_cross_entropy_equals_autograd_in_float64():
    torch.manual_seed(0)
    h = torch.randn(20, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (20,))
    t[[3, 17]] = -1
    ref = F.cross_entropy(h @ w.t(), t, ignore_index=-1)
    ref_grads = torch.autograd.grad(2.5 * ref, (h, w))
    for chunks in (1, 3, 7, 40):  # one chunk, uneven chunks, more chunks than rows
        out = linear_cross_entropy(h, w, t, chunks)
        grads = torch.autograd.grad(2.5 * out, (h, w))  # an upstream gradient other than 1
        torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-13)
    with torch.no_grad():  # evaluation: no gradient work, same loss
        torch.testing.assert_close(linear_cross_entropy(h, w, t, 4), ref.detach(), rtol=1e-13, atol=1e-13)


def test_chunked_fp16_gradient_stays_finite_on_large_hidden_states():
    """The chunk's fp16 products are scaled up only as far as they stay finite: 1024 rows of hidden states
    40 x N(0, 1) and four targets make weight-gradient entries in the thousands before any scale (2^14 overflowed
    them), so the scale goes below 1 (1/8)."""
    g = torch.Generator().manual_seed(0)
    h, w = 40 * torch.randn(1024, 8, generator=g), 0.01 * torch.randn(64, 8, generator=g)
    t = torch.randint(0, 4, (1024,), generator=g)
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.autograd.grad(F.cross_entropy(h64 @ w64.t(), t), (h64, w64))
    h, w = h.requires_grad_(), w.requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        grads = torch.autograd.grad(linear_cross_entropy(h, w, t, 1), (h, w))
    for grad, r in zip(grads, ref):
        assert (grad.double() - r).norm() / r.norm() <= 4 * torch.finfo(torch.float16).eps / 2


def test_chunked_loss_equals_plain_path_fp32():
    plain, fast, idx, targets = pair()
    loss, grads = loss_and_grads(plain, idx, targets)
    fast_loss, fast_grads = loss_and_grads(fast, idx, targets)
    torch.testing.assert_close(fast_loss, loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == fast_grads.keys()
    for name in grads:  # the tied wte/lm_head weight gets both of its gradients
        torch.testing.assert_close(fast_grads[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)
    logits, _ = fast(idx, targets)
    assert logits is None  # the point: the (B*T, V) logits are never built
    plain_logits, _ = plain(idx)
    torch.testing.assert_close(fast(idx)[0], plain_logits, rtol=0, atol=0)  # no targets: the plain path


def test_chunked_loss_equals_float64_reference():
    """The plain path computes its cross-entropy in fp32 (`.float()`); the float64 reference does not."""
    _, fast, idx, targets = pair(torch.float64, chunks=4)
    logits, _ = fast(idx)
    ref = F.cross_entropy(logits.view(-1, 96), targets.view(-1), ignore_index=-1)
    ref_grads = torch.autograd.grad(ref, list(fast.parameters()))
    loss, grads = loss_and_grads(fast, idx, targets)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
    for (name, _), g in zip(fast.named_parameters(), ref_grads):
        torch.testing.assert_close(grads[name], g, rtol=1e-10, atol=1e-12, msg=name)


# 2048 rows over 2048 tokens: softmax / n_valid is about 2e-7 at init, among fp16's subnormals (under 6e-5)
WIDE_VOCAB = dict(block_size=16, vocab_size=2048, n_layer=1, n_head=2, n_embd=8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_speed_options_keep_half_precision_gradients(dtype):
    """Every speed option on, under fp16 autocast with a GradScaler (as the trainer runs fp16) and under bf16
    autocast: every gradient is within 4 units of roundoff u, normwise, of the float64 one and of the plain
    path's (which is itself within 1.3u of float64 here). A gradient is a few roundings deep, each at most u.
    The chunked loss used to cast softmax / n_valid to fp16 before the scaler's scale: 735u on ln_f's."""
    u = torch.finfo(dtype).eps / 2
    plain, fast, idx, targets = pair(config=WIDE_VOCAB, batch_size=128, attention_backend="cudnn,flash")
    ref_loss, ref = loss_and_grads(copy.deepcopy(plain).double(), idx, targets)
    autocast = torch.autocast("cpu", dtype=dtype)
    results = [loss_and_grads(model, idx, targets, autocast, torch.amp.GradScaler("cpu", enabled=dtype == torch.float16))
               for model in (plain, fast)]
    (loss, grads), (fast_loss, fast_grads) = results
    torch.testing.assert_close(fast_loss, loss, rtol=1e-5, atol=0)  # the same logits, softmax in fp32
    for name, r in ref.items():
        for what, g, against in (("fast", fast_grads[name], r), ("plain", grads[name], r),
                                 ("fast - plain", fast_grads[name], grads[name])):
            error = (g.double() - against.double()).norm() / r.norm()
            assert error <= 4 * u, f"{name} {what}: {error / u:.1f}u"


@pytest.mark.long
@pytest.mark.xdist_group("inductor")  # with the other inductor tests: see tests/test_activations.py
def test_chunked_loss_under_torch_compile():
    """Dynamo and AOTAutograd take the chunked loss's autograd.Function whole: the loss and every gradient of the plain
    path. aot_eager generates no code; inductor's code for it is tests/test_train_gpt2.py's compiled run (chunked)."""
    plain, fast, idx, targets = pair(config=TRAINER_MODEL, batch_size=4)
    loss, grads = loss_and_grads(plain, idx, targets)
    compiled = torch.compile(fast, dynamic=False, backend="aot_eager")
    for _ in range(2):  # the second call reuses the graph
        fast_loss, fast_grads = loss_and_grads(compiled, idx, targets)
        torch.testing.assert_close(fast_loss, loss, rtol=1e-6, atol=1e-6)
        for name in grads:
            torch.testing.assert_close(fast_grads[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_attention_backend_choices_and_cpu_no_op():
    assert sdpa_backends("auto") is None
    assert [b.name for b in sdpa_backends("cudnn,flash")] == ["CUDNN_ATTENTION", "FLASH_ATTENTION"]
    for bad in ("fast", "cudnn,", ""):
        with pytest.raises(ValueError, match="unknown attention_backend .* choose auto or one or more"):
            GPT(GPTConfig(**TINY), attention_backend=bad, seed=0)
    with pytest.raises(ValueError, match="loss_chunks=-1 must be >= 0"):
        GPT(GPTConfig(**TINY), loss_chunks=-1, seed=0)
    plain, fast, idx, targets = pair(chunks=0, attention_backend="cudnn")  # cuDNN does not exist on CPU
    assert torch.equal(fast(idx, targets)[1], plain(idx, targets)[1])


def test_trainer_rejects_bad_speed_options_before_touching_data():
    import train_gpt2
    from training.config import ConfigError, load_config

    for argv, message in [(["--compile-mode", "fastest"], "unknown compile_mode 'fastest'; choose default"),
                          (["--loss-chunks", "-2"], "loss_chunks=-2 must be >= 0"),
                          (["--attention-backend", "flsh"], "unknown attention_backend 'flsh'")]:
        cfg = load_config(train_gpt2.TrainConfig, argv + ["--data-dir", "/nonexistent"])
        with pytest.raises((ConfigError, ValueError), match=message):
            train_gpt2.train(cfg)
