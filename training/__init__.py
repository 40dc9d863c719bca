"""The trainer and its commands. The library by role: common/ (errors, device, progress), run/ (one
training run), methods/ (what a user switches on), inference/ (a trained model's outputs), results/
(finished runs), api.py; the commands beside them (train.py, evaluate.py, ..., and `minbert`, main.py).
The experiment drivers apart, above the library: experiments/ (sweep/, study/, search/, report.py,
stats.py). docs/development.md draws the layout."""
