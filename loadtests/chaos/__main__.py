"""``python -m loadtests.chaos``: see ``--help`` and docs/chaos.md."""

from loadtests.chaos._cli import main

raise SystemExit(main())
