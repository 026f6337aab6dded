# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Entry point for `python -m runner`."""

import sys

from runner.cli import main

sys.exit(main())
