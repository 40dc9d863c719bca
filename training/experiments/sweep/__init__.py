"""The sweep: depth x size x seed runs and their records (minbert sweep)."""
