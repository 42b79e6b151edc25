"""SIGTERM/SIGINT -> finish the current step, save a checkpoint, then exit with 128 + the signal number."""
import signal


class GracefulStop:
    def __init__(self):
        self.requested = False
        self.signum = None
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def close(self):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _handle(self, signum, frame):
        if self.requested:
            if signum == signal.SIGINT:  # a second Ctrl-C means "now"
                signal.signal(signum, self._previous[signum])
                raise KeyboardInterrupt
            # a repeated SIGTERM is the same request: a preempted worker under torchrun gets SLURM's and then
            # torchrun's, and must still save
            return
        self.requested, self.signum = True, signum
        print(f"\nsignal {signal.Signals(signum).name}: saving a checkpoint after this step, then exiting "
              "(Ctrl-C again aborts at once)", flush=True)
