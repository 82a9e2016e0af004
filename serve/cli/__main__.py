"""``python -m serve.cli``: the old spelling of ``python -m cli`` (moved; see ``serve.cli``)."""

import sys

from serve.cli import main

sys.exit(main())
