"""``python -m reconciler`` runs the command line, as the ``triton-gitops`` script does."""

import sys

from reconciler.cli import main

sys.exit(main())
