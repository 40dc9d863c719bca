import sys

from training.experiments.study.cli import main

sys.exit(main())
