"""python -m training: the minbert command (training/main.py)."""
import sys

from training.main import main

sys.exit(main())
