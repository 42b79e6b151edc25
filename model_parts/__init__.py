"""The parts of model.py's GPT-2 that are not GPT-2: its parametrization's multipliers, the chunked loss, and
transformers' weight layout."""
