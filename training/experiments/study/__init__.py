"""The freezing study: the published layer-freezing experiments as recipes the sweep runs.

    minbert study depth          # Lee et al.'s depth study on the three tasks together
    minbert study size           # depth x training-set size (the scarce-data write-up)
    minbert study seed-report    # the 'Freeze Your Layers' table on our model

recipe.py reads a recipe (recipes/*.json) and plans its runs; training.experiments.sweep trains them (resumable,
several workers); aggregate.py computes what is reported; tables.py and figures.py write it.
"""
