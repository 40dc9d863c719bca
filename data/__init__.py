"""The CS224N multitask data: strict loaders for the course's CSV files, and their download."""
