"""Stand-ins for activations/selfcheck.probe that tests/test_kernel_policy.py and tests/test_selfcheck.py inject
into activations/policy.py's child process (module-level, so that the child unpickles them by name): the
ways a kernel never run on this GPU can end, and two timings."""
import os
import signal
import time


def kernel_faster(name, state, shape, device, dtype, compiled):
    return {"triton": 1.0, "torch": 2.0}


def kernel_slower(name, state, shape, device, dtype, compiled):
    return {"triton": 3.0, "torch": 2.0}


def raising(name, state, shape, device, dtype, compiled):
    raise RuntimeError("ptxas fatal: simulated failure")


def aborting(name, state, shape, device, dtype, compiled):
    os.abort()


def segfault(name, state, shape, device, dtype, compiled):
    os.kill(os.getpid(), signal.SIGSEGV)


def hanging(name, state, shape, device, dtype, compiled):
    time.sleep(600)


def wrong_values(name, state, shape, device, dtype, compiled):
    """The real probe, with AGLU's kernel 0.1% off (outside the fp32 tolerance)."""
    from activations import kernels, selfcheck
    real = kernels.apa
    kernels.apa = lambda *a: real(*a) * 1.001
    return selfcheck.probe(name, state, shape, device, dtype, compiled)


def by_rank(name, state, shape, device, dtype, compiled):
    """torchrun's rank 1 cannot run AGLU's kernel; the ranks disagree on which NSwish path is faster."""
    rank = int(os.environ["RANK"])
    if name == "aglu" and rank == 1:
        raise RuntimeError("ptxas fatal: simulated failure")
    return [{"triton": 1.0, "torch": 5.0}, {"triton": 4.0, "torch": 2.0}][rank]


def slow_pass(name, state, shape, device, dtype, compiled):
    time.sleep(1)
    return {"triton": 1.0, "torch": 2.0}
