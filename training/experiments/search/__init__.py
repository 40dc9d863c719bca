"""Hyperparameter search on Optuna (the optional extra: pip install -e ".[search]").

    minbert search SPACE.json --out runs/search            # one worker; start it again for more
    minbert search SPACE.json --out runs/search --storage postgresql://user@host/db

space.py reads the search space; engine.py runs trials (each an ordinary run directory) on a study
that every worker shares; summary.py writes the table, the best trial or the Pareto front, and figures.
"""
