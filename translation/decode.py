"""Batched greedy and beam search with an incremental decoder cache, and `translate` for raw sentences.

Output length is capped per sentence at max_len_a * src_len + max_len_b tokens (EOS included): at the
cap EOS is forced. Beam search follows fairseq: each step keeps 2*beam candidates, EOS candidates
ranked within the top `beam` become finished hypotheses scored by sum(log p) / len**len_penalty,
the best `beam` others continue; a sentence is done once it has `beam` finished hypotheses.
"""
import torch
import torch.nn.functional as F
from tqdm import tqdm


def length_limits(src, pad_id, max_len_a, max_len_b, max_positions):
    src_len = (src != pad_id).sum(1)
    return (max_len_a * src_len + max_len_b).long().clamp(1, max_positions)


def _step_log_probs(model, tokens, memory, mask, cache, step, limits):
    logits = model.decode(tokens, memory, mask, cache)[:, -1].float()
    logp = F.log_softmax(logits, dim=-1)
    logp[:, model.cfg.pad_id] = -torch.inf
    logp[:, model.cfg.bos_id] = -torch.inf
    at_cap = step + 1 >= limits  # the token produced now is number step+1: only EOS, at its true log-prob
    not_eos = torch.arange(logp.size(1), device=logp.device) != model.cfg.eos_id
    logp[at_cap[:, None] & not_eos] = -torch.inf
    return logp


@torch.no_grad()
def greedy(model, src, max_len_a=1.2, max_len_b=10):
    """src [B,S] -> list of B token lists (no BOS/EOS)."""
    cfg = model.cfg
    memory, mask = model.encode(src)
    limits = length_limits(src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions)
    B = src.size(0)
    cache = model.new_cache()
    tokens = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    out = torch.full((B, int(limits.max())), cfg.eos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for step in range(int(limits.max())):
        logp = _step_log_probs(model, tokens, memory, mask, cache, step, limits)
        nxt = logp.argmax(-1)
        out[:, step] = torch.where(done, cfg.eos_id, nxt)
        done |= nxt == cfg.eos_id
        if done.all():
            break
        tokens = nxt[:, None]
    return [_strip(row, cfg.eos_id) for row in out.tolist()]


def _strip(row, eos):
    return row[:row.index(eos)] if eos in row else row


@torch.no_grad()
def beam_search(model, src, beam=5, len_penalty=1.0, max_len_a=1.2, max_len_b=10):
    """src [B,S] -> list of B token lists (best finished hypothesis, no BOS/EOS)."""
    cfg = model.cfg
    B, K, dev = src.size(0), beam, src.device
    memory, mask = model.encode(src)
    rows = torch.arange(B, device=dev).repeat_interleave(K)
    memory, mask = memory[rows], mask[rows]
    limits = length_limits(src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions)
    row_limits = limits[rows]
    cache = model.new_cache()
    hyps = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long, device=dev)
    scores = torch.zeros(B, K, device=dev)
    scores[:, 1:] = -torch.inf  # all beams start identical: expand only the first one
    finished = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    for step in range(int(limits.max())):
        logp = _step_log_probs(model, hyps[:, -1:], memory, mask, cache, step, row_limits)
        V = logp.size(1)
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)
        top_scores, top_idx = cand.topk(2 * K, dim=1)
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == cfg.eos_id
        length = step + 1  # generated tokens, EOS included
        for b, j in (is_eos[:, :K] & ~done[:, None]).nonzero().tolist():
            if len(finished[b]) < K and torch.isfinite(top_scores[b, j]):
                seq = hyps[b * K + top_beam[b, j], 1:].tolist()
                finished[b].append((top_scores[b, j].item() / length ** len_penalty, seq))
        done |= torch.tensor([len(f) >= K for f in finished], device=dev)
        if done.all():
            break
        # continue with the best K non-EOS candidates (2K candidates hold at least K of them)
        live = top_scores.masked_fill(is_eos, -torch.inf)
        keep_scores, keep = live.topk(K, dim=1)
        src_rows = (torch.arange(B, device=dev)[:, None] * K + top_beam.gather(1, keep)).view(-1)
        hyps = torch.cat([hyps[src_rows], top_tok.gather(1, keep).view(-1, 1)], dim=1)
        scores = keep_scores
        model.reorder_cache(cache, src_rows)
    return [max(f)[1] if f else [] for f in finished]


@torch.no_grad()
def translate(model, sp, sentences, beam=1, len_penalty=1.0, max_len_a=1.2, max_len_b=10, batch_size=64,
              device="cpu", progress=False):
    """Raw source sentences -> detokenized translations, in order (batches are length-sorted for speed)."""
    cfg = model.cfg
    was_training = model.training
    model.eval()
    ids = [sp.encode(s)[:cfg.max_positions - 1] + [cfg.eos_id] for s in sentences]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=f"{'greedy' if beam == 1 else f'beam {beam}'}", disable=not progress):
        chunk = order[start:start + batch_size]
        width = max(len(ids[i]) for i in chunk)
        src = torch.tensor([ids[i] + [cfg.pad_id] * (width - len(ids[i])) for i in chunk], device=device)
        if beam == 1:
            hyps = greedy(model, src, max_len_a, max_len_b)
        else:
            hyps = beam_search(model, src, beam, len_penalty, max_len_a, max_len_b)
        for i, h in zip(chunk, hyps):
            out[i] = sp.decode(h)
    model.train(was_training)
    return out
