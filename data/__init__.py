"""Data: GPT-2 token shards (data/fineweb.py writes them, data/loader.py reads them), the GPT-2 tokenizer,
and parallel corpora for translation (data/parallel_corpus.py)."""


class DataError(ValueError):
    """Input data that cannot be used as it is (missing, malformed, misaligned); the message says what to do."""
