"""What runs where, the top room: the sweep's command line (cli.py), its plan read once (plan.py), the order its runs
start in (schedule.py), where they execute (launchers/), where they stand (status.py) and what they cost
(cost.py). It starts the trainers, so it may import them (and every room below); no room imports it."""
