# Hides triton from this interpreter, as on a machine without it (a CI-like check; triton stays installed):
# `import triton` raises ModuleNotFoundError and importlib.util.find_spec("triton") returns None.
import sys

sys.modules["triton"] = None
