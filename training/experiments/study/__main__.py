import sys

from training.study.cli import main

sys.exit(main())
