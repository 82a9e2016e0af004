"""gunicorn settings for production: ``gunicorn --config serve/process/gunicorn_conf.py``.

Everything comes from rlserve's one config (YAML via RLSERVE_CONFIG_FILE, RLSERVE_* env):
bind from host/port, worker count from ``workers``, and a graceful timeout longer than the
drain delay plus the in-flight budget, so gunicorn never kills a draining worker early.
Workers load the app themselves (no preload): each owns its onnxruntime sessions.

gunicorn reads every public module-level name here as a setting of the same name, so
helpers are imported under private names (``config`` is gunicorn's own setting).
"""

import os
import shutil
from pathlib import Path
from typing import Any

from serve import config as _config

_settings = _config.load()

# Every worker writes metrics here; /metrics sums them (see serve/metrics.py).
_metrics_dir = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", "/tmp/rlserve-metrics"))

wsgi_app = "serve.process.app:create_app()"
worker_class = "serve.process.worker.RLServeWorker"
bind = f"{_settings.host}:{_settings.port}"
workers = _settings.workers
preload_app = False
graceful_timeout = int(_settings.drain_delay_s + _settings.graceful_timeout_s + 5)
timeout = 60  # a worker that stops heart-beating this long is restarted
keepalive = 75  # longer than common load balancers' idle timeout (60 s)
accesslog = None  # rlserve writes its own structured access log
# No gunicornc control socket: it defaults to ~/.gunicorn/, which a read-only, home-less
# container cannot create, and every gunicorn of the same user would share it.
control_socket_disable = True


def on_starting(server: Any) -> None:
    shutil.rmtree(_metrics_dir, ignore_errors=True)
    _metrics_dir.mkdir(parents=True, exist_ok=True)


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
