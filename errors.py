"""The project's own errors: input a user can fix, said in one line.

A script ends with `error: <message>` (exit status 1) for these and only these; every other exception, torch's,
numpy's or a bug's own ValueError included, keeps its traceback, which is what a user reports. Each also
subclasses the builtin type its callers catch (ValueError, FileNotFoundError, RuntimeError), so code written
against those keeps working. Every room may import this file; it imports nothing of ours.
"""


class NanoactError(Exception):
    """Bad input a user can fix; the message says what is wrong and what to do."""


class ConfigError(NanoactError, ValueError):
    """An option, its value or a combination of them (a config file, the command line, activation kwargs)."""


class CheckpointError(NanoactError, ValueError):
    """A checkpoint that cannot be read, saved or used by this command."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    pass


class DataError(NanoactError, ValueError):
    """Input data that cannot be used as it is (missing, malformed, misaligned)."""


class DataNotFound(DataError, FileNotFoundError):
    pass


class TokenizerError(NanoactError, RuntimeError):
    """The tokenizer's files cannot be loaded or are not GPT-2's."""


class DistributedError(NanoactError, RuntimeError):
    """The device or the process group cannot be set up as asked."""

