"""Token shards: data/fineweb.py writes them, data/loader.py reads them."""
