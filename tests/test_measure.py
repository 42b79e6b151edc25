"""The literature's measurements (eval/sparsity.py, eval/internals.py, eval/measure.py), each on a case whose answer
is known."""
import json
import math

import pytest
import torch

from errors import ConfigError
from eval import internals, sparsity
from stats.significance import paired
from eval.measure import main as measure_main
from model import GPT, GPTConfig

TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)


def test_planted_zeros_and_dead_neurons():
    a = torch.rand(100, 8) + 0.1
    a[:, [2, 5]] = 0  # two dead neurons
    a[:50, 0] = 0  # half of another one
    result = sparsity.dense_sparsity({"h.0": [a[:60], a[60:]]})["h.0"]
    assert result["dead"] == 2 / 8
    assert result["zeros"] == pytest.approx((200 + 50) / 800)


def cett(a, w, keep):
    """CETT as ReLU^2 Wins writes it: mean over tokens of ||W (a * ~keep)|| / ||W a||."""
    return ((a * ~keep) @ w.t()).norm(dim=-1).div((a @ w.t()).norm(dim=-1)).mean().item()


def test_cett_of_a_known_output():
    """W = identity: a token (3, 4, 0, 0) has output norm 5; dropping the neuron of size 3 leaves an error of 3."""
    a, w = torch.tensor([[3.0, 4.0, 0.0, 0.0]]), torch.eye(4)
    assert cett(a, w, torch.tensor([[False, True, True, True]])) == pytest.approx(0.6)
    layer = sparsity.curves(a, w)
    eps, share = sparsity.cett_threshold(layer, 0.61)
    assert eps == 4 and share == 0.75  # the zeros and the 3 are dropped, not the 4
    eps, share = sparsity.cett_threshold(layer, 0.59)  # below 0.6: only the zeros can go
    assert eps == 3 and share == 0.5
    assert sparsity.topk_sparsity(layer, 0.61) == 0.75  # k = 1 keeps the 4
    assert sparsity.topk_sparsity(layer, 0.59) == 0.5  # k = 2


def test_cett_threshold_is_the_largest_feasible_where_cett_is_not_monotone():
    """Dropped contributions can cancel: a = (1, 1.1, 2) on columns e1, -e1, e2 has CETT 0.499 at eps 1.05 and
    0.050 at eps 1.5, so the largest threshold within 0.2 drops two neurons, not none. On random neurons the
    scan's threshold and top-k are those of a brute-force search over every threshold and k."""
    a, w = torch.tensor([[1.0, 1.1, 2.0]]), torch.tensor([[1.0, -1.0, 0.0], [0.0, 0.0, 1.0]])
    assert cett(a, w, torch.tensor([[False, True, True]])) == pytest.approx(0.499, abs=1e-3)
    assert cett(a, w, torch.tensor([[False, False, True]])) == pytest.approx(0.050, abs=1e-3)
    assert sparsity.cett_threshold(sparsity.curves(a, w), 0.2) == (2.0, pytest.approx(2 / 3))
    gen = torch.Generator().manual_seed(0)
    a, w = torch.relu(torch.randn(40, 16, generator=gen)), torch.randn(6, 16, generator=gen)
    layer, size = sparsity.curves(a, w), a * w.norm(dim=0)
    eps = max(e for e in size.unique().tolist() if cett(a, w, size >= e) <= 0.2)
    assert sparsity.cett_threshold(layer, 0.2) == (pytest.approx(eps), (size < eps).float().mean().item())
    order = size.argsort(dim=-1, descending=True)
    top = [torch.zeros_like(a, dtype=torch.bool).scatter_(-1, order[:, :k], True) for k in range(17)]
    k = min(k for k in range(17) if cett(a, w, top[k]) <= 0.2)
    assert sparsity.topk_sparsity(layer, 0.2) == 1 - k / 16


def relu_model_that_needs_its_mlps():
    """A ReLU model whose loss needs its MLPs: every c_proj column along the target token's embedding, so each
    neuron dropped lowers the target's logit; and 8 sequences of 16 tokens (target token 0)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, act="relu"), seed=0).eval()
    target = model.transformer.wte.weight[0].detach()
    with torch.no_grad():
        for block in model.transformer.h:
            block.mlp.c_proj.weight.copy_(0.1 * torch.outer(target / target.norm(), torch.ones(64)))
    x = torch.randint(0, 64, (8, 16))
    return model, [(x[:4], torch.zeros_like(x[:4])), (x[4:], torch.zeros_like(x[4:]))]


def calibration_curves(model, calibration):
    neurons = {}
    with sparsity.captured(model, neurons), torch.no_grad():
        for x, _ in calibration:
            model(x, head=False)
    return {n: sparsity.curves(torch.cat(a), model.transformer.h[int(n[2:])].mlp.c_proj.weight.detach())
            for n, a in neurons.items()}


def test_ppl_sparsity_starts_at_the_exact_zeros_and_grows_strictly_with_p():
    """p -> 0 keeps only the exact zeros dropped (about half), each larger p drops strictly more, and the
    truncated model keeps its perplexity budget on the sequences it was calibrated on."""
    model, batches = relu_model_that_needs_its_mlps()
    calibration, evaluation = sparsity.split(sparsity.sequences_of(batches))
    layers = calibration_curves(model, calibration)
    dense = sparsity.sequence_losses(model, calibration)[0].mean()
    cut = sparsity.sequence_losses(model, calibration, {n: math.inf for n in layers})[0].mean()
    assert dense < cut - 0.2  # the MLPs matter
    zeros = sparsity.sequence_losses(model, evaluation)[1].mean()
    found = {p: sparsity.ppl_sparsity(model, calibration, evaluation, layers, p) for p in (0.0, 1e-6, 0.1, 1.0, 10)}
    assert 0.4 < zeros < 0.6 and found[0.0]["sparsity"] == found[1e-6]["sparsity"] == zeros
    assert zeros < found[0.1]["sparsity"] < found[1.0]["sparsity"] < found[10]["sparsity"] < 1
    for p, got in found.items():
        thresholds = {n: sparsity.cett_threshold(layer, got["cett_target"])[0] for n, layer in layers.items()}
        assert sparsity.sequence_losses(model, calibration, thresholds)[0].mean() <= dense + math.log1p(p / 100)


def test_ppl_sparsity_is_calibrated_on_one_half_and_judged_with_standard_errors_on_the_other():
    """The target is the calibration sequences' alone (other evaluation sequences leave it as it is); the ratio and
    sparsity reported are the evaluation sequences', with standard errors over those sequences (scipy's sem of
    their paired loss differences, by the delta method, and of their sparsities); fewer than 4 sequences cannot
    be split."""
    model, batches = relu_model_that_needs_its_mlps()
    calibration, evaluation = sparsity.split(sparsity.sequences_of(batches))
    assert len(calibration) == len(evaluation) == 4
    layers = calibration_curves(model, calibration)
    got = sparsity.ppl_sparsity(model, calibration, evaluation, layers, 5.0)
    other = sparsity.ppl_sparsity(model, calibration, evaluation[:2] + calibration[:2], layers, 5.0)
    assert other["cett_target"] == got["cett_target"] > 0 and other["ppl_ratio"] != got["ppl_ratio"]
    thresholds = {n: sparsity.cett_threshold(layer, got["cett_target"])[0] for n, layer in layers.items()}
    loss, dropped, _ = sparsity.sequence_losses(model, evaluation, thresholds)
    diff = loss - sparsity.sequence_losses(model, evaluation)[0]
    assert got["ppl_ratio"] == pytest.approx(math.exp(diff.mean()))
    assert got["ppl_ratio_se"] > 0
    assert got["ppl_ratio_se"] == pytest.approx(math.exp(diff.mean()) * diff.std(ddof=1) / 2)
    assert got["sparsity_se"] > 0 and got["sparsity_se"] == pytest.approx(dropped.std(ddof=1) / 2)
    assert got["sparsity"] == pytest.approx(dropped.mean())
    assert got["sequences"] == {"calibration": 4, "evaluation": 4}
    with pytest.raises(ConfigError, match="at least 4 sequences"):
        sparsity.split(sparsity.sequences_of(batches)[:3])


def test_signal_propagation_of_known_growth():
    """A stream that each block adds independent N(0, v) noise to has variance 1 + l v after block l."""
    torch.manual_seed(0)
    v, streams = 0.5, [torch.randn(1, 20000, 64) + 2.0]
    for _ in range(3):
        streams.append(streams[-1] + v ** 0.5 * torch.randn_like(streams[-1]))
    rows = internals.signal_propagation(streams)
    for depth, row in enumerate(rows):
        assert row["variance"] == pytest.approx(1 + depth * v, rel=0.03)
        assert row["squared_mean"] == pytest.approx(4.0, rel=0.03)
        if depth:
            assert row["branch_variance"] == pytest.approx(v, rel=0.03)


def test_silent_branches_uniform_attention_and_a_massive_activation():
    """Zero output projections: the stream is the embeddings at every depth; zero queries and keys: every head
    attends uniformly, entropy ln(t+1) at position t; one planted value: the massive-activation ratio."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY), seed=0)
    C = model.config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * C].zero_()
            block.attn.c_attn.bias[:2 * C].zero_()
            block.attn.c_proj.weight.zero_(), block.mlp.c_proj.weight.zero_()
            block.attn.c_proj.bias.zero_(), block.mlp.c_proj.bias.zero_()
    x = torch.randint(0, 64, (3, 16))
    result = internals.measure(model, x)
    first = result["signal"][0]
    for row in result["signal"][1:]:
        assert row["variance"] == pytest.approx(first["variance"], rel=1e-6) and row["branch_variance"] == 0
    uniform = sum(math.log(t + 1) for t in range(16)) / 16
    assert result["attention_entropy"] == [[pytest.approx(uniform, rel=1e-5)] * 2] * 2
    streams = [torch.ones(1, 10, 4), torch.ones(1, 10, 4)]
    streams[1][0, 3, 2] = 500.0
    assert internals.massive_activations(streams) == [{"max": 500.0, "median": 1.0, "ratio": 500.0}]


@pytest.mark.long
def test_the_command_measures_a_run_and_its_init(tmp_path, capsys):
    from conftest import tiny_checkpoint
    from test_train_gpt2 import write_corpus

    data = write_corpus(tmp_path / "data")
    ckpt = tiny_checkpoint(tmp_path, act="relu", block_size=16, vocab_size=64)
    results = measure_main([str(ckpt), "--data", str(data), "--tokens", "256", "--out", str(tmp_path / "out")])
    (result,) = results.values()
    assert set(result) == {"step", "init", "trained"}
    assert result["trained"]["model"]["zeros"] > 0.2  # ReLU: about half its inputs are below zero
    assert len(result["init"]["signal"]) == 3 and len(result["trained"]["attention_entropy"]) == 2
    assert json.loads((tmp_path / "out" / "measure.json").read_text()).keys() == results.keys()
    assert (tmp_path / "out" / "signal_propagation.png").stat().st_size > 10_000
    assert "CETT@0.2" in capsys.readouterr().out


def fake_run(act, seed, zeros, entropy):
    from analysis.runs import RunRecord
    record = {"sparsity": {"h.0": {"zeros": zeros, "dead": 0.0}, "h.1": {"zeros": zeros, "dead": 0.0}},
              "massive": [{"max": 4.0, "median": 1.0, "ratio": 4.0}],
              "attention_entropy": [[entropy, entropy]], "signal": [{"variance": 1.0}, {"variance": 2.0}]}
    return RunRecord(path=None, label=f"{act}_seed{seed}", config={"model": {"act": act}, "run": {"seed": seed}},
               measures=[(10, None, record)])


def test_arms_differ_beyond_seed_noise_where_their_measures_do():
    """relu has 0.5 zeros on every seed, gelu none: beyond noise; the entropies scatter around the same value:
    within noise."""
    from analysis import literature_measures
    from analysis.compare import table

    runs = {"gelu": [fake_run("gelu", s, 0.0, 1.9 + 0.01 * s) for s in (1, 2, 3)],
            "relu": [fake_run("relu", s, 0.5 + 0.01 * s, 1.9 + 0.01 * (4 - s)) for s in (1, 2, 3)]}
    diffs = literature_measures.paired_differences(runs, {"gelu": None, "relu": "gelu"})
    assert diffs["relu"]["zeros"]["mean"] == pytest.approx(0.52)
    assert literature_measures.beyond_noise(diffs["relu"]["zeros"]) is True
    assert literature_measures.beyond_noise(diffs["relu"]["attention_entropy"]) is False
    assert literature_measures.beyond_noise(diffs["relu"]["massive"]) is False  # identical on every seed
    assert literature_measures.beyond_noise(paired({1: 0.0}, {1: 1.0})) is None  # one seed: no interval
    (line,) = literature_measures.sentences(diffs, {"relu": "gelu"})
    assert "in zeros +0.52 [" in line and line.endswith("within noise: dead, massive, attention_entropy, stream_growth")
    header, _, first = table(runs["relu"]).splitlines()[:3]
    assert "| zeros " in header and "| 0.51 " in first  # analysis.compare's columns


def test_the_sweep_report_says_which_measures_differ_between_arms(tmp_path):
    from analysis import sweep_report
    from training.runlog import RunLog

    for act, zeros in (("gelu", 0.0), ("relu", 0.5)):
        for seed in (1, 2, 3):
            log = RunLog(tmp_path / f"{act}_seed{seed}")
            log.write_run_info({"model": {"act": act}, "optim": {"max_steps": 2, "total_batch_size": 64},
                                "run": {"seed": seed}}, {})
            for step in (0, 2):
                log.record(step, kind="eval", val_loss=3.0 + seed / 10, tokens=step * 64,
                           measure=fake_run(act, seed, zeros + 0.01 * seed, 1.9 + 0.01 * seed * (act == "gelu"))
                           .measures[0][2])
            log.record(1, kind="train", loss=3.0, tok_per_s=1.0, tokens=64)
            log.close()
    text = sweep_report.report(tmp_path, acts=["gelu", "relu"])
    assert "- relu - gelu: differs beyond seed noise (95% interval over 3 seeds excludes 0) in zeros +0.5 [" in text
    assert "unadjusted, exploratory" in text  # no error control over the measures: they declare nothing
    assert json.loads((tmp_path / "sweep.json").read_text())["measures"]["relu"]["zeros"]["seeds"] == [1, 2, 3]
    assert (tmp_path / "compare_measures.png").is_file()
