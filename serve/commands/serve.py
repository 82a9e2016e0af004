"""``rlserve serve``: the development server (uvicorn, one process).

Production runs gunicorn with ``serve/process/gunicorn_conf.py``; both read the same settings
(see ``serve.config`` for the precedence: flags > RLSERVE_* env > config file > defaults).

The flags are generated from ``serve.config.Settings``: every setting is a ``--kebab-case``
flag whose help is the field's description, except those in :data:`NO_FLAG`; ``model_file``
is the positional ``MODEL_FILE`` and ``config_file`` is ``--config``.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from cli import settings_arguments

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

NAME = "serve"
HELP = "serve a model repository over HTTP (and gRPC with --grpc-port); development server"
EXTRA = None

# Settings with no flag, and why.
NO_FLAG = {
    "admin_token": "a secret on a command line is seen by every user of the machine (ps)",
    "episode_token": "a secret on a command line is seen by every user of the machine (ps)",
    "result_cache": "its Redis URL may hold a password, which a command line shows (ps)",
    "version_policy": "an object: RLSERVE_VERSION_POLICY as JSON, or the --config file",
    "features": "an object: RLSERVE_FEATURES as JSON, or a model's config.yaml",
    "canary": "an object: a model's config.yaml (or RLSERVE_CANARY as JSON)",
}
POSITIONAL = "model_file"
FLAGS = {"config_file": "--config"}  # flags not named --kebab-case after their setting

_EPILOG = (
    "A flag given here beats RLSERVE_<NAME>, which beats the --config file (or "
    "RLSERVE_CONFIG_FILE), which beats the default. {no_flag} have no flag: set them in "
    "RLSERVE_<NAME> or the file."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serve.config import ENV_PREFIX, ModelSettings

    fields = flagged()
    per_model = {n: f for n, f in fields.items() if n in ModelSettings.model_fields}
    own = {n: f for n, f in fields.items() if n not in per_model and n != POSITIONAL}
    settings_arguments.add_positional(parser, POSITIONAL, fields[POSITIONAL], env_prefix=ENV_PREFIX)
    server = parser.add_argument_group("server settings")
    settings_arguments.add_settings(server, own, env_prefix=ENV_PREFIX, flags=FLAGS)
    models = parser.add_argument_group(
        "every model's settings", "the defaults a model's own config.yaml may override"
    )
    settings_arguments.add_settings(models, per_model, env_prefix=ENV_PREFIX, flags=FLAGS)
    *others, last = NO_FLAG
    parser.epilog = _EPILOG.format(no_flag=f"{', '.join(others)} and {last}")


def flagged() -> dict[str, FieldInfo]:
    """The settings given on the command line, by name, in the order Settings has them."""
    from serve.config import Settings

    return {n: f for n, f in Settings.model_fields.items() if n not in NO_FLAG}


def settings_given(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings on the command line (None: not given), for ``serve.config.load``."""
    return settings_arguments.given(namespace, flagged())


def run(namespace: argparse.Namespace) -> int:
    import uvicorn

    from serve import config
    from serve.control import repository, single_file
    from serve.process import logs, production
    from serve.process.app import create_app
    from serve.process.server import DrainingServer

    overrides = settings_given(namespace)
    settings = config.load(**overrides)
    logs.configure(settings.log_level)
    served = single_file.as_repository(settings)
    repository.discover(served.model_repository)  # fail fast on a wrong path
    if settings.workers > 1 and "workers" in settings.model_fields_set:
        return production.run_gunicorn(overrides, settings.workers)
    app = create_app(served)
    uv_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=settings.proxy_headers,
        server_header=False,
        timeout_graceful_shutdown=int(settings.graceful_timeout_s),
    )
    logging.getLogger("rlserve").info(
        "serving %s on http://%s:%d (docs at /docs)%s",
        settings.model_file or settings.model_repository,
        settings.host,
        settings.port,
        "" if settings.grpc_port is None else f", gRPC on {settings.host}:{settings.grpc_port}",
    )
    DrainingServer(uv_config, app).run()
    return 0
