"""Moved to ``serve/process/gunicorn_conf.py`` (with the rest of the process code). This file
keeps ``gunicorn --config serve/gunicorn.conf.py`` working, with a warning, for a release."""

import warnings

from serve.process.gunicorn_conf import *  # noqa: F403

warnings.warn(
    "serve/gunicorn.conf.py moved to serve/process/gunicorn_conf.py: "
    "run gunicorn --config serve/process/gunicorn_conf.py (this path goes in the next release)",
    FutureWarning,
    stacklevel=1,
)
