"""Corpus BLEU with sacrebleu on detokenized text (sacrebleu's own 13a tokenization, cased), and the
translation model's BLEU evaluation: decode a split over all ranks, gather, score.

    python eval/bleu.py HYPOTHESES.txt REFERENCES.txt [--lowercase]

Scores on detokenized text are comparable across papers only with the same signature; fairseq's
IWSLT14 numbers (~34.4) are tokenized and lowercased, so they read higher than sacrebleu's.
"""
import json
import sys
import time
from pathlib import Path

from sacrebleu.metrics import BLEU

from data.parallel_corpus import read_lines
from errors import DataError, NanoactError
from training import distributed
from translation.decode import translate


def corpus_bleu(hypotheses, references, lowercase=False):
    """(BLEU score, sacrebleu signature string) of detokenized hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must align")
    bleu = BLEU(tokenize="13a", lowercase=lowercase)
    score = bleu.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(bleu.get_signature())


def decode_cost(n, seconds):
    """How long decoding n sentences took, as the logs print it."""
    return f"{n} sentences in {seconds:.1f}s = {n / max(seconds, 1e-9):.1f} sent/s"


def translate_and_score(model, sp, src, ref, ecfg, d, beam, progress=False):
    """Translate src (split over ranks), gather, score: (BLEU, signature, hypotheses, decode seconds) on
    every rank."""
    t0 = time.time()
    # an OOM on one rank: every rank fails before the gather, none waits there for it
    mine = distributed.before_collective(lambda: translate(model, sp, src[d.rank::d.world_size], beam, ecfg.len_penalty,
                                                           ecfg.max_len_a, ecfg.max_len_b, ecfg.decode_batch, d.device,
                                                           progress and d.master), d)
    parts = distributed.gather_objects(mine, d)
    hyps = [None] * len(src)
    for r, part in enumerate(parts):
        hyps[r::d.world_size] = part
    seconds = time.time() - t0
    score, signature = corpus_bleu(hyps, ref)
    return score, signature, hyps, seconds


def split_bleu(model, sp, src, ref, ecfg, d, out_dir, split):
    """Greedy and beam BLEU on the first --test-sentences sentences of a split's (source, reference) lines
    (0: all) and the decoding speed; translations and scores written to out_dir."""
    total = len(src)
    n = min(ecfg.test_sentences or total, total)
    src, ref = src[:n], ref[:n]
    subset = "" if n == total else f" (first {n} of {total} sentences)"
    results = {}
    for beam in sorted({1, ecfg.beam}):
        name = "greedy" if beam == 1 else f"beam{beam}"
        score, signature, hyps, seconds = translate_and_score(model, sp, src, ref, ecfg, d, beam, progress=True)
        results[name] = {"bleu": score, "signature": signature, "sentences": n, "of": total,
                         "seconds": round(seconds, 2), "sentences_per_s": round(n / max(seconds, 1e-9), 2)}
        if d.master:
            Path(out_dir, f"translations_{split}_{name}.txt").write_text("\n".join(hyps) + "\n")
            print(f"{split} BLEU ({name}) = {score:.2f}{subset}  {signature} | {decode_cost(n, seconds)}", flush=True)
    if d.master:
        Path(out_dir, f"bleu_{split}.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv):
    args = [a for a in argv if a != "--lowercase"]
    if len(args) != 2 or "-h" in argv or "--help" in argv:
        raise SystemExit(__doc__)
    try:
        score, signature = corpus_bleu(read_lines(args[0]), read_lines(args[1]), "--lowercase" in argv)
    except NanoactError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"BLEU {score:.2f}  ({signature})")


if __name__ == "__main__":
    main(sys.argv[1:])
