"""Subcommands of the ``rlserve`` command (see ``cli``)."""
