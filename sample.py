"""Sample text from a GPT-2: a nanoact checkpoint, a run directory, a build-nanogpt or nanoGPT checkpoint, or
transformers GPT-2 weights (a directory, or a hub name such as gpt2).

    python sample.py log/aglu                                        # the run's newest checkpoint
    python sample.py log/aglu/model_19073.pt --prompt "Hello, I'm a language model," --num-samples 5
    python sample.py out/ckpt.pt --prompt-file prompt.txt --max-new-tokens 200 --temperature 0.8 --top-k 200
    python sample.py gpt2 --device cuda --dtype bfloat16 --compile  # OpenAI's GPT-2 124M from the hub

Samples are written to stdout, separated by a line of dashes; the timing goes to stderr. The samples of one
command are generated together, as one batch, with a KV cache (--no-kv-cache: recompute the whole context at
every token, as nanoGPT does). The same --seed gives the same text on the same device and dtype.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from data.tokenizer import EOT, VOCAB_SIZE, TokenizerError, gpt2_tokenizer
from model import GPT
from training.checkpoint import CheckpointError, load_checkpoint
from training.distributed import pick_device
from training.precision import autocast_for

SEPARATOR = "-" * 40


def load_model(source, device):
    """The model behind `source`: a checkpoint file or run directory, else transformers GPT-2 weights."""
    path = Path(source)
    transformers_dir = path.is_dir() and (path / "config.json").is_file()
    if transformers_dir or not (path.exists() or path.suffix == ".pt"):
        return GPT.from_pretrained(source).to(device).eval()
    return GPT.from_checkpoint(load_checkpoint(source, kind="gpt2"), device)


def read_prompt(args):
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"{args.prompt_file}: cannot read the prompt file ({e.strerror})") from None
    return args.prompt


def sample(model, enc, prompt, num_samples, max_new_tokens, temperature, top_k, seed, device, autocast,
           use_cache=True):
    """[text of each sample] (the prompt included), and the seconds generation took."""
    tokens = enc.encode(prompt, allowed_special={"<|endoftext|>"}) or [EOT]  # no prompt: a document's start
    if len(tokens) >= model.config.block_size:
        raise ValueError(f"the prompt has {len(tokens)} tokens, the model's context is {model.config.block_size}; "
                         "shorten it")
    idx = torch.tensor(tokens, device=device).repeat(num_samples, 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    start = time.perf_counter()
    with autocast:
        out = model.generate(idx, max_new_tokens, temperature, top_k, generator, use_cache)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # a padded vocabulary (50304) has ids no tokenizer knows; a trained model all but never samples them
    return [enc.decode([t for t in row if t < enc.n_vocab]) for row in out.tolist()], seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="checkpoint file, run directory (its newest checkpoint), transformers GPT-2 "
                                  "directory, or hub name (gpt2, gpt2-medium, openai-community/gpt2)")
    p.add_argument("--prompt", default="", help="text to continue (default: none, a new document)")
    p.add_argument("--prompt-file", help="read the prompt from this file instead")
    p.add_argument("--num-samples", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="< 1 sharper, > 1 more random")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 autocast on CUDA), float32 or bfloat16")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward (pays off for long samples)")
    p.add_argument("--kv-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the keys/values of earlier tokens (--no-kv-cache: recompute the context each token)")
    args = p.parse_args(argv)
    if args.prompt and args.prompt_file:
        p.error("give --prompt or --prompt-file, not both")
    if args.num_samples < 1 or args.max_new_tokens < 1 or args.top_k < 0 or args.temperature <= 0:
        p.error("--num-samples and --max-new-tokens must be >= 1, --top-k >= 0, --temperature > 0")
    try:
        device = pick_device(args.device)
        autocast = autocast_for(device.split(":")[0], args.dtype)
        enc = gpt2_tokenizer()
        model = load_model(args.source, device)
        if model.config.vocab_size < VOCAB_SIZE:
            raise ValueError(f"{args.source}: a {model.config.vocab_size}-token vocabulary (character-level data?); "
                             f"sample.py decodes GPT-2's {VOCAB_SIZE} BPE tokens only")
        if args.compile:
            model.forward = torch.compile(model.forward, dynamic=True)  # generate calls forward with new lengths
        texts, seconds = sample(model, enc, read_prompt(args), args.num_samples, args.max_new_tokens,
                                args.temperature, args.top_k or None, args.seed, device, autocast, args.kv_cache)
    except (CheckpointError, TokenizerError, FileNotFoundError, RuntimeError, ValueError) as e:
        sys.exit(f"error: {e}")
    for text in texts:
        print(text, SEPARATOR, sep="\n", flush=True)
    new = args.num_samples * args.max_new_tokens
    print(f"{new} new tokens in {seconds:.2f}s ({new / seconds:,.1f} tok/s, {args.num_samples} samples, "
          f"kv cache {'on' if args.kv_cache else 'off'}, {device})", file=sys.stderr)


if __name__ == "__main__":
    main()
