"""Step-0 loss of the translation Transformer on random tokens, per norm, with the output projection tied to
the (shared, sqrt(d)-scaled) embedding or untied, and with torchscale's DeepNet init for comparison.

    python bench/translation_init_loss.py                       # 6L-6L, d 512, vocab 10000 (the paper's model)
    python bench/translation_init_loss.py --d-model 256 --layers 3 --vocab 4000

`copy logit` is the mean logit of the decoder *input* token at each position: a model that predicts its
input puts ~all its mass there, and its loss on a different target is about that logit. ln V is the loss of
a uniform prediction; logits ~N(0, 1) give ln V + 0.5.
"""
import argparse
import math

import torch
import torch.nn as nn

from translation.model import NORMS, Transformer, TranslationConfig


def torchscale_init(model):
    """torchscale's DeepNet init (architecture/encoder.py, decoder.py, encoder-decoder case): PyTorch's default
    nn.Linear init, then fc1, fc2, out_proj and v_proj divided by (N^4 M)^(1/16) / 1.15 in the encoder and by
    (12 M)^(1/4) in the decoder."""
    n, m = len(model.encoder), len(model.decoder)
    for layers, scale in ((model.encoder, (n ** 4 * m) ** (1 / 16) / 1.15), (model.decoder, (12 * m) ** 0.25)):
        for module in layers.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        for name, p in layers.named_parameters():
            if any(key in name for key in ("fc1", "fc2", "out_proj", "v_proj")):
                p.data.div_(scale)


@torch.no_grad()
def step0(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    copy = logits.gather(-1, tgt[:, :-1, None])[:, 1:].mean().item()  # from position 1: position 0 is BOS
    return model.loss(logits, tgt[:, 1:]).item(), copy


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=24)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, args.vocab, (args.batch, args.length), generator=g)
    tgt = torch.randint(4, args.vocab, (args.batch, args.length + 1), generator=g)
    tgt[:, 0] = 2  # BOS
    print(f"d {args.d_model}, {args.layers}L-{args.layers}L, vocab {args.vocab}: ln V = {math.log(args.vocab):.2f}")
    print("| norm | output | init | step-0 loss | copy logit |\n|---|---|---|---|---|")
    for norm in NORMS:
        for tie, init in ((True, "nanoact"), (True, "torchscale"), (False, "nanoact")):
            if init == "torchscale" and norm != "deepnorm":
                continue
            torch.manual_seed(0)
            model = Transformer(TranslationConfig(vocab_size=args.vocab, enc_layers=args.layers,
                                                  dec_layers=args.layers, d_model=args.d_model,
                                                  ffn_dim=2 * args.d_model, n_head=4, dropout=0.0, norm=norm,
                                                  tie_output=tie), seed=0).eval()
            if init == "torchscale":
                torchscale_init(model)
            loss, copy = step0(model, src, tgt)
            print(f"| {norm} | {'tied' if tie else 'untied'} | {init} | {loss:.2f} | {copy:.2f} |")


if __name__ == "__main__":
    main()
