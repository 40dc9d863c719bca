"""One training run: its config, the Run and its phases, building, the run directory, checkpoints,
preflight, signals."""
