import sys

from training.experiments.search.cli import main

sys.exit(main())
