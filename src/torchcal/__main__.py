"""``python -m torchcal`` (and ``torchrun ... -m torchcal train ...``) runs the CLI."""

import sys

from .cli import main

sys.exit(main())
