"""``python -m torchcal.cli`` runs the command line (as ``python -m torchcal`` does)."""

import sys

from . import main

sys.exit(main())
