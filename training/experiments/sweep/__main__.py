import sys

from training.sweep.cli import main

sys.exit(main())
