"""Finished runs and what is computed from them: a run read back from its directory, statistics over seeds
and dev examples, summaries of a sweep."""
