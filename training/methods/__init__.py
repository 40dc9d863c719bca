"""What a user switches on in a run: freezing and its schedules, the frozen-prefix cache, PCGrad, SMART,
EMA, parameter-efficient methods, data parallelism, compilation, and the stepper that combines them."""
