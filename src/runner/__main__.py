"""Entry point for `python -m runner`."""

import sys

from runner.cli import main

sys.exit(main())
