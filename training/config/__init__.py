"""The configuration of a run: TrainConfig and its validation (train_config.py), and the small languages of
the method flags parsed on their own (freeze_spec.py, peft_spec.py). Below methods/: it imports none of them."""
