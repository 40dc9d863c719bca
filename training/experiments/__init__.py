"""The experiment drivers, apart from the trainer library: each job one command.

    minbert sweep    sweep/      freezing depth x training-set size x seed, resumable, several workers
    minbert study    study/      the freezing study's recipes (study/recipes/*.json), trained by the sweep
    minbert search   search/     hyperparameter search over a space of options (Optuna)
    minbert report   report.py   summarise a sweep, draw a run's training curves, compare runs
    minbert stats    stats.py    does recipe B beat recipe A? tests over seeds and dev examples

They import the library (training.run, training.config, training.results, ...); the library never imports
them (tests/test_layout.py).
"""
