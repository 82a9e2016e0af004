"""``python -m cli``: the ``rlserve`` command without its console script."""

import sys

from cli import main

sys.exit(main())
