"""`python -m sweep ...`: the sweep's command line (sweep/cli.py)."""
from sweep.cli import main

main()
