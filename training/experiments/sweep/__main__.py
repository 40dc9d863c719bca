import sys

from training.experiments.sweep.cli import main

sys.exit(main())
