"""Reading, comparing, plotting and sweeping training runs (log reading needs no torch)."""
