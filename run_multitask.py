#!/usr/bin/env python
"""Train one BERT on SST-5, Quora and STS-B. `python run_multitask.py --help` lists every flag.

    python run_multitask.py                              # MiniLM, cross-encoded pairs, 3 epochs
    python run_multitask.py --freeze-upto 3 --smart      # freeze embeddings + layers 0-2, SMART
"""
import sys

from training.train import main

if __name__ == "__main__":
    sys.exit(main())
