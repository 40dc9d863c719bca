"""Training recipes: the multi-task loop, evaluation, checkpoints, PCGrad and SMART."""
