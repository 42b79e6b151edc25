"""Reading runs back, comparing them, and the reports and figures of sweeps and ladders (log reading needs no torch)."""
