"""``python -m reconciler`` runs the command line, as the ``triton-gitops`` script does."""

from __future__ import annotations

import sys

from reconciler.cli import main

sys.exit(main())
