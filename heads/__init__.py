"""Task heads (SST-5, Quora paraphrase, STS-B) and the multi-task model around one encoder."""
from .tasks import KIND, MultitaskBert, ParaphraseHead, SentimentHead, SimilarityHead, predict, probabilities, task_loss

__all__ = ["KIND", "MultitaskBert", "ParaphraseHead", "SentimentHead", "SimilarityHead", "predict", "probabilities",
           "task_loss"]
