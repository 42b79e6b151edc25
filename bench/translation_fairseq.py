"""nanoact's translation baseline beside fairseq 0.12's `transformer`, on the same data: the 3L-3L d 256 model
(FFN 512, 4 heads, ReLU, dropout 0.1, separate source/target embeddings, untied output), the IWSLT16 De-En
sample's pairs of at most 50 sentencepiece pieces (BPE 4000), Adam (0.9, 0.98), lr 1e-3, inverse-sqrt warmup
1000, label smoothing 0.1, weight decay 1e-4, clip 3.0, 2048 tokens a batch, 1500 updates, one CPU thread.

    python bench/translation_fairseq.py --prepare runs/fs               # spm-encoded text for fairseq + its commands
    python bench/translation_fairseq.py --out-dir runs/fs/nanoact_postln --norm postln      # nanoact's side
    python bench/translation_fairseq.py --report runs/fs/nanoact_postln runs/fs/fairseq     # the table rows

--prepare writes the pairs nanoact trains on (the same sentencepiece model and length filter), dev2010 and the
first --test-sentences of tst2014 as pieces, and prints the fairseq-preprocess/train/generate commands that train
and decode on them. --report reads either side's run directory: dev NLL in nats (fairseq logs base 2) at each
evaluation, and sacrebleu BLEU (beam 5 and greedy, detokenized, cased) with the output/reference length ratio.
"""
import argparse
import json
import math
import re
from pathlib import Path

from sacrebleu.metrics import BLEU

from data.parallel_corpus import encode, load_sentencepiece, load_split, read_lines, sentencepiece_model

S = "../shared/assets/iwslt"
TRAIN = f"{S}/iwslt16_train_sample/train_sample_19689"
VALID = f"{S}/iwslt17_dev_test/IWSLT17.TED.dev2010.de-en"
TEST = f"{S}/iwslt17_dev_test/IWSLT17.TED.tst2014.de-en"
SETUP = dict(enc_layers=3, dec_layers=3, d_model=256, ffn_dim=512, n_head=4, act="relu", dropout=0.1,
             share_embeddings="false", tie_output="false", spm_vocab_size=4000, max_len=50, max_tokens=2048,
             lr=1e-3, warmup_steps=1000, label_smoothing=0.1, weight_decay=1e-4, grad_clip=3.0,
             max_steps=1500, eval_interval=500, beam=5, max_len_a=1.2, max_len_b=10)

FAIRSEQ = """\
# fairseq 0.12 (a throwaway venv: pip install fairseq-fixed==0.12.3.1), from {d}
fairseq-preprocess --source-lang de --target-lang en --trainpref {d}/text/train --validpref {d}/text/valid \\
    --testpref {d}/text/test --destdir {d}/bin --joined-dictionary --workers 1
OMP_NUM_THREADS=1 fairseq-train {d}/bin --arch transformer --encoder-layers 3 --decoder-layers 3 \\
    --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \\
    --encoder-attention-heads 4 --decoder-attention-heads 4 --activation-fn relu --dropout 0.1 \\
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 1000 \\
    --weight-decay 1e-4 --clip-norm 3.0 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \\
    --max-tokens 2048 --max-update 1500 --validate-interval-updates 500 --validate-interval 1000 \\
    --save-interval-updates 500 --save-interval 1000 --no-epoch-checkpoints --seed 1 --cpu --num-workers 0 \\
    --save-dir {d}/fairseq --log-format simple --log-interval 100 2>&1 | tee {d}/fairseq/train.log
for beam in 5 1; do TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 OMP_NUM_THREADS=1 fairseq-generate {d}/bin --cpu \\
    --path {d}/fairseq/checkpoint_last.pt --gen-subset test --beam $beam --max-len-a 1.2 --max-len-b 10 \\
    --batch-size 64 --required-batch-size-multiple 1 --post-process sentencepiece \\
    > {d}/fairseq/generate_beam$beam.txt; done"""


def prepare(out, test_sentences, spm_dir):
    """The pieces of what nanoact trains, validates and tests on, one sentence a line, for fairseq-preprocess."""
    src, tgt = load_split("train", "de", "en", prefix=TRAIN)
    sp = load_sentencepiece(sentencepiece_model(src, tgt, SETUP["spm_vocab_size"], "bpe", spm_dir))
    text = Path(out, "text")
    text.mkdir(parents=True, exist_ok=True)
    valid, test = load_split("valid", "de", "en", prefix=VALID), load_split("test", "de", "en", prefix=TEST)
    splits = {"train": encode(sp, src, tgt, SETUP["max_len"]), "valid": encode(sp, *valid, 1023),
              "test": encode(sp, *(side[:test_sentences] for side in test))}
    for split, (src_ids, tgt_ids) in splits.items():
        for lang, ids in (("de", src_ids), ("en", tgt_ids)):
            lines = (" ".join(sp.id_to_piece(int(i)) for i in sentence) for sentence in ids)
            Path(text, f"{split}.{lang}").write_text("\n".join(lines) + "\n")
        print(f"{split}: {len(src_ids)} pairs")
    Path(out, "fairseq").mkdir(exist_ok=True)
    print(FAIRSEQ.format(d=out))


def train_nanoact(args):
    import train_translation
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in SETUP.items()]
    train_translation.main(flags + [f"--train-prefix={TRAIN}", f"--valid-prefix={VALID}", f"--test-prefix={TEST}",
                                    f"--norm={args.norm}", f"--out-dir={args.out_dir}", f"--seed={args.seed}",
                                    f"--spm-dir={args.spm_dir}", f"--test-sentences={args.test_sentences}",
                                    "--bleu-sentences=100", "--checkpoint-interval=500", "--log-interval=100",
                                    "--device=cpu", "--compile=false"] + args.extra)


def bleu_and_ratio(hyps, refs):
    score = BLEU(tokenize="13a").corpus_score(hyps, [refs])
    return score.score, score.sys_len / score.ref_len


def fairseq_hyps(path):
    """fairseq-generate's detokenized D-lines, in the order of the test file."""
    found = {}
    for line in read_lines(path):
        if line.startswith("D-"):
            index, _, text = line[2:].split("\t", 2)
            found[int(index)] = text
    return [found[i] for i in range(len(found))]


def report(run_dir, test_sentences):
    """(norm or 'fairseq', {step: dev NLL in nats}, {beam: (BLEU, length ratio)})."""
    run = Path(run_dir)
    refs = read_lines(f"{TEST}.en")[:test_sentences]
    if (run / "train.log").is_file():  # fairseq: valid nll_loss is in bits per token
        log = (run / "train.log").read_text()
        nll = {int(m[2]): float(m[1]) * math.log(2)
               for m in re.finditer(r"\| valid on 'valid' subset .*?\| nll_loss ([\d.]+) .*?\| num_updates (\d+)", log)}
        scores = {b: bleu_and_ratio(fairseq_hyps(run / f"generate_beam{b}.txt"), refs) for b in (5, 1)}
        return "fairseq", nll, scores
    records = [json.loads(line) for line in read_lines(run / "metrics.jsonl")]
    nll = {r["step"]: r["val_loss"] for r in records if "val_loss" in r and r["step"] > 0}
    names = {5: "beam5", 1: "greedy"}
    scores = {b: bleu_and_ratio(read_lines(run / f"translations_test_{names[b]}.txt"), refs) for b in (5, 1)}
    norm = json.loads((run / "run.json").read_text())["config"]["model"]["norm"]
    return norm, nll, scores


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", metavar="DIR", help="write the spm-encoded text for fairseq and print its commands")
    p.add_argument("--report", nargs="+", metavar="RUN_DIR", help="table rows of nanoact or fairseq run directories")
    p.add_argument("--out-dir", default="runs/translation_fairseq/nanoact", help="nanoact's run directory")
    p.add_argument("--norm", default="postln", choices=("postln", "preln", "deepnorm"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--spm-dir", default="runs/spm")
    p.add_argument("--test-sentences", type=int, default=300, help="the first N sentences of tst2014")
    p.add_argument("extra", nargs="*", help="further train_translation.py flags for nanoact's side (after --)")
    args = p.parse_args(argv)
    if args.prepare:
        return prepare(args.prepare, args.test_sentences, args.spm_dir)
    if args.report:
        print("| system | norm | dev NLL (nats) @ updates | "
              f"tst2014[:{args.test_sentences}] BLEU beam5 / greedy | length ratio beam5 / greedy |\n|---|---|---|---|---|")
        for run_dir in args.report:
            norm, nll, scores = report(run_dir, args.test_sentences)
            system = "fairseq" if norm == "fairseq" else "nanoact"
            print(f"| {system} | {'post-LN' if norm == 'fairseq' else norm} | "
                  + " / ".join(f"{nll[s]:.3f} @{s}" for s in sorted(nll))
                  + f" | {scores[5][0]:.2f} / {scores[1][0]:.2f} | {scores[5][1]:.2f} / {scores[1][1]:.2f} |")
        return None
    return train_nanoact(args)


if __name__ == "__main__":
    main()
