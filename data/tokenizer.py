"""GPT-2's BPE through tiktoken: the one tokenizer of the FineWeb shards, HellaSwag and the lm-eval model."""
from errors import TokenizerError

EOT = 50256  # <|endoftext|>: starts every document in the shards; also the (masked) padding token in scoring
VOCAB_SIZE = 50257  # GPT-2 BPE tokens; the GPT pads its embedding table to 50304 (model.py) for faster matmuls


def gpt2_tokenizer():
    import tiktoken  # imported here: commands that never tokenize start faster

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/OS errors when it cannot fetch its BPE files
        raise TokenizerError(f"cannot load tiktoken's gpt2 encoding ({type(e).__name__}); offline, point "
                             "TIKTOKEN_CACHE_DIR at a cache holding the GPT-2 BPE files") from None
