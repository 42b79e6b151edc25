"""Batch shapes and padding of the translation loader: how many distinct (B, S, T) shapes an epoch has (each
one is a compilation for torch.compile) and which fraction of the padded tokens are real, per --pad-multiple.

    python bench/translation_batches.py --train-prefix ../shared/assets/iwslt/multi30k/train
    python bench/translation_batches.py --train-prefix PREFIX --vocab 10000 --max-tokens 8192 --max-sentences 256

Reads {prefix}.de/.en, trains (or reuses from --spm-dir) the joint sentencepiece model, keeps pairs of at
most --max-len pieces as the trainer does, and walks --epochs epochs of the training loader.
"""
import argparse

import numpy as np

from data.parallel_corpus import TokenBatchLoader, encode, load_sentencepiece, load_split, sentencepiece_model


def walk(loader, epochs):
    """(distinct shapes, batches per epoch, real/padded source tokens, real/padded target tokens)."""
    shapes, real_src, real_tgt, padded_src, padded_tgt = set(), 0, 0, 0, 0
    for _ in range(epochs * len(loader)):
        x, _, y_out = loader.next_batch()
        shapes.add((*x.shape, y_out.shape[1]))
        pairs = (y_out != 0).any(1)  # not the filler rows, whose source is a lone EOS
        real_src, padded_src = real_src + (x[pairs] != 0).sum().item(), padded_src + x.numel()
        real_tgt, padded_tgt = real_tgt + (y_out != 0).sum().item(), padded_tgt + y_out.numel()
    return len(shapes), len(loader), real_src / padded_src, real_tgt / padded_tgt


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-prefix", required=True)
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--spm-dir", default="/tmp/nanoact_spm")
    p.add_argument("--max-len", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--max-sentences", type=int, default=0)
    p.add_argument("--pad-multiples", default="1,8,16")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    src, tgt = load_split("train", args.src_lang, args.tgt_lang, prefix=args.train_prefix)
    sp = load_sentencepiece(sentencepiece_model(src, tgt, args.vocab, "bpe", args.spm_dir))
    ids = encode(sp, src, tgt, args.max_len)
    lengths = np.maximum([len(s) for s in ids[0]], [len(t) for t in ids[1]]) + 1
    print(f"{args.train_prefix}: {len(ids[0])} pairs, longest side + EOS: mean {lengths.mean():.1f}, "
          f"max {lengths.max()}; --max-tokens {args.max_tokens} --max-sentences {args.max_sentences}")
    print(f"| pad multiple | distinct (B, S, T) in {args.epochs} epochs | batches/epoch | real source tokens | "
          "real target tokens |\n|---|---|---|---|---|")
    for multiple in (int(m) for m in args.pad_multiples.split(",")):
        loader = TokenBatchLoader(*ids, args.max_tokens, args.max_sentences, seed=0, pad_multiple=multiple)
        n, batches, fill_src, fill_tgt = walk(loader, args.epochs)
        print(f"| {multiple} | {n} | {batches} | {100 * fill_src:.1f}% | {100 * fill_tgt:.1f}% |")


if __name__ == "__main__":
    main()
