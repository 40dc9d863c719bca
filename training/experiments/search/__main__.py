import sys

from training.search.cli import main

sys.exit(main())
