"""The trainer and its commands. The library by role: common/ (errors, device, progress), run/ (one
training run), methods/ (what a user switches on), inference/ (a trained model's outputs), results/
(finished runs), sweep/, study/, search/, api.py; the commands beside them (train.py, evaluate.py, ...,
and `minbert`, main.py). docs/development.md draws the layout."""
