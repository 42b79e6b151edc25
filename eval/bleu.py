"""Corpus BLEU with sacrebleu on detokenized text (sacrebleu's own 13a tokenization, cased).

    python eval/bleu.py HYPOTHESES.txt REFERENCES.txt [--lowercase]

Scores on detokenized text are comparable across papers only with the same signature; fairseq's
IWSLT14 numbers (~34.4) are tokenized and lowercased, so they read higher than sacrebleu's.
"""
import sys

from sacrebleu.metrics import BLEU

from data.parallel_corpus import read_lines


def corpus_bleu(hypotheses, references, lowercase=False):
    """(BLEU score, sacrebleu signature string) of detokenized hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must align")
    bleu = BLEU(tokenize="13a", lowercase=lowercase)
    score = bleu.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(bleu.get_signature())


def main(argv):
    args = [a for a in argv if a != "--lowercase"]
    if len(args) != 2 or "-h" in argv or "--help" in argv:
        raise SystemExit(__doc__)
    try:
        score, signature = corpus_bleu(read_lines(args[0]), read_lines(args[1]), "--lowercase" in argv)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"BLEU {score:.2f}  ({signature})")


if __name__ == "__main__":
    main(sys.argv[1:])
