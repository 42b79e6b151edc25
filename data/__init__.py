"""Data: GPT-2 token shards (data/fineweb.py writes them, data/loader.py reads them), the GPT-2 tokenizer,
and parallel corpora for translation (data/parallel_corpus.py)."""
import os
import urllib.error
import urllib.request

from errors import DataError  # noqa: F401  (data's callers catch it from here)


def hub_unreachable(timeout=10):
    """Why the Hugging Face hub cannot be reached, or "" if it answers at all (any HTTP status will do).
    One quick request: offline, `datasets` retries for a long while and then raises a long traceback."""
    try:
        request = urllib.request.Request(os.environ.get("HF_ENDPOINT", "https://huggingface.co"), method="HEAD")
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError:
        pass
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))
    return ""
