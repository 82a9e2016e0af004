"""``rlserve serve``: the development server (uvicorn, one process).

Production runs gunicorn with ``serve/gunicorn.conf.py``; both read the same settings
(see ``serve.config`` for the precedence: flags > RLSERVE_* env > config file > defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from serve.cli.arguments import add_arguments as add_dataclass_arguments
from serve.cli.arguments import arg, from_namespace

NAME = "serve"
HELP = "serve a model repository over HTTP (and gRPC with --grpc-port); development server"
EXTRA = None

_FROM_CONFIG = "default: RLSERVE_* env, then --config, then "


@dataclass
class ServeArgs:
    model_file: Path | None = field(
        default=None,
        metadata=arg(
            "one exported model.onnx to serve alone, read-only, instead of a repository",
            positional=True,
            nargs="?",
            metavar="MODEL_FILE",
        ),
    )
    model_repository: Path | None = field(
        default=None, metadata=arg("folder laid out as <model>/<version>/model.onnx")
    )
    config_file: Path | None = field(
        default=None, metadata=arg("YAML file with any server setting", flag="--config")
    )
    host: str | None = field(default=None, metadata=arg(_FROM_CONFIG + "127.0.0.1"))
    port: int | None = field(default=None, metadata=arg(_FROM_CONFIG + "8000"))
    workers: int | None = field(
        default=None,
        metadata=arg(
            "worker processes; more than 1 runs the production server (gunicorn with "
            "serve/gunicorn.conf.py, these settings passed on); " + _FROM_CONFIG + "one process"
        ),
    )
    grpc_port: int | None = field(
        default=None,
        metadata=arg(
            "also serve the Open Inference Protocol over gRPC on this port (Triton's is 8001); "
            + _FROM_CONFIG
            + "no gRPC"
        ),
    )
    default_model: str | None = field(
        default=None, metadata=arg("model answering POST /predict (default: the only one)")
    )
    max_batch_size: int | None = field(default=None, metadata=arg(_FROM_CONFIG + "32"))
    max_wait_ms: float | None = field(
        default=None, metadata=arg("wait for more rows after the first; " + _FROM_CONFIG + "0")
    )
    max_queue_rows: int | None = field(
        default=None, metadata=arg("queued rows before 429; " + _FROM_CONFIG + "1024")
    )
    default_deadline_ms: float | None = field(
        default=None, metadata=arg("per-request deadline; " + _FROM_CONFIG + "1000")
    )
    generation_deadline_ms: float | None = field(
        default=None,
        metadata=arg("language models: per-request deadline; " + _FROM_CONFIG + "60000"),
    )
    providers: list[str] | None = field(
        default=None,
        metadata=arg("onnxruntime execution provider, repeat in order (default: auto)"),
    )
    allow_cpu_fallback: bool = field(
        default=False, metadata=arg("stay ready when a requested GPU provider is not active")
    )
    gpu_memory_limit_bytes: int | None = field(
        default=None,
        metadata=arg(
            "cap on the CUDA provider's memory arena and TensorRT's workspace (GPUs shared by "
            "several servers); " + _FROM_CONFIG + "onnxruntime's default, no cap"
        ),
    )
    poll_interval_s: float | None = field(
        default=None,
        metadata=arg(
            "watch the repository for new versions and models this often (pull mode; default: off)"
        ),
    )
    observation_bounds: str | None = field(
        default=None,
        metadata=arg(
            "an observation outside its Box's bounds: serve it as given, clip it, or refuse "
            "it (422); " + _FROM_CONFIG + "allow",
            choices=["allow", "clip", "reject"],
        ),
    )
    drain_delay_s: float | None = field(
        default=None,
        metadata=arg("keep serving after SIGTERM with /ready 503; " + _FROM_CONFIG + "0"),
    )
    log_level: str | None = field(
        default=None,
        metadata=arg(
            "debug, info, warning or error", choices=["debug", "info", "warning", "error"]
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, ServeArgs)
    parser.epilog = (
        "Every setting can also come from RLSERVE_<NAME> or the YAML --config file; the admin "
        "token for live updates only from RLSERVE_ADMIN_TOKEN or the file."
    )


def run(namespace: argparse.Namespace) -> int:
    import uvicorn

    from serve import config
    from serve.control import repository, single_file
    from serve.process import logs, production
    from serve.process.app import create_app
    from serve.process.server import DrainingServer

    args = from_namespace(ServeArgs, namespace)
    overrides = dataclasses.asdict(args)
    overrides["allow_cpu_fallback"] = True if args.allow_cpu_fallback else None
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
    DrainingServer(uv_config, app.state).run()
    return 0
