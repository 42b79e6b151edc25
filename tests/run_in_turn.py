"""`torchrun ... tests/train_in_turn.py ARGV --- ARGV ...`: train_gpt2.py's runs one after another in the same
workers. One torchrun job then serves several tests (the agent's and the workers' start-up is most of a tiny
run's cost); each run sets up and tears down its own process group, as a job of its own would."""
import sys

import train_gpt2

if __name__ == "__main__":
    argv = sys.argv[1:]
    while argv:
        end = argv.index("---") if "---" in argv else len(argv)
        train_gpt2.main(argv[:end])
        argv = argv[end + 1:]
