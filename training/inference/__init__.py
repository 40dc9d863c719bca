"""A trained model's outputs: running it, the metrics, the prediction file formats and sets."""
