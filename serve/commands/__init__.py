"""Subcommands of the ``rlserve`` command (see ``serve.cli``)."""
