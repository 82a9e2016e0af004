"""``python -m serve.cli``: the ``rlserve`` command without its console script."""

import sys

from serve.cli import main

sys.exit(main())
