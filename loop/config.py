"""The RL loop's one typed configuration: the reference deployment guides' shapes
(``rl_config.yaml``, ``decoupled_config.yaml``, ``sync_policy.yaml``) load as written, plus
the fields rlserve needs that they do not cover. docs/rl-loop.md, "Configuration", has the
table of what each field maps to.

Sources, highest precedence first:

1. keyword arguments to :func:`load` (a command's flags);
2. environment variables ``RLSERVE_LOOP_<FIELD>``, sections joined by ``__``
   (``RLSERVE_LOOP_DATA_BUFFER__BROKERS=kafka-0:9092``,
   ``RLSERVE_LOOP_SYNC_POLICY__MAX_STALENESS=8``; a whole section as JSON also works);
   the admin token only from ``RLSERVE_LOOP_ADMIN_TOKEN``, else the server's
   ``RLSERVE_ADMIN_TOKEN`` (one Secret for both), never from a file;
3. the YAML files named by ``config_file`` / ``RLSERVE_LOOP_CONFIG_FILE`` (several separated
   by ``os.pathsep``), merged in order, section by section: a later file's field wins
   (``decoupled_config.yaml`` + ``sync_policy.yaml`` make one configuration);
4. the defaults below.

The prefix is ``RLSERVE_LOOP_``, not the server's ``RLSERVE_``, so that a server's and a
loop's variables can share one environment without one reading the other's.

Nothing is read at import time, and importing this module imports no buffer client:
settings exist once :func:`load` is called; the methods that open buffers import them.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from cli.config_file import merged
from cli.config_file import read as read_yaml
from kernel.errors import ConfigError
from loop.group_names import group_name_problem

if TYPE_CHECKING:
    from loop.buffers.base import BufferOptions, Consumer, Producer
    from loop.controller import LoopMetrics, SyncController

ENV_PREFIX = "RLSERVE_LOOP_"
SERVER_TOKEN_ENV = "RLSERVE_ADMIN_TOKEN"  # the server's variable: the trainer pushes with it
ClusterMode = Literal["co-located", "decoupled"]
BufferType = Literal["kafka", "redis", "file", "memory"]
SCHEMES: tuple[str, ...] = get_args(BufferType)
Role = Literal["inference", "training"]
DEFAULT_TOPIC = "rl_experience"
DEFAULT_BROKERS = "localhost:9092"
DEFAULT_REDIS = "localhost:6379/0"
DEFAULT_DIRECTORY = Path("/tmp/rlserve-experience")
OFFLINE_SUFFIX = "_offline"
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*")
_GPU_PART = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
_FILE_ONLY = ("admin_token",)  # fields a file may not set (secrets)
PositiveInt = Annotated[int, Field(gt=0)]


# ---------------------------------------------------------------------- value types


def parse_duration(value: Any) -> float:
    """``"10ms"``, ``"0.5s"`` -> seconds. A bare number is refused: its unit is a guess."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"{value!r} has no unit; write a duration with one: '10ms' or '0.01s'")
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a duration; write a number and ms or s: '10ms', '1s'")
    number, unit = float(match[1]), match[2]
    seconds = number / 1000 if unit == "ms" else number
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def parse_gpus(value: Any) -> tuple[int, ...]:
    """GPU indices: ``"0-3"``, ``"0,2"``, ``"0-1,4"``, ``2``, ``[0, 1]``; none: ``[]``."""
    if value is None:
        return ()
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a GPU index; write '0-3', '0,2' or a list")
    if isinstance(value, int):
        parts: list[Any] = [value]
    elif isinstance(value, str):
        parts = [p for p in value.split(",") if p.strip()] if value.strip() else []
    elif isinstance(value, Sequence):
        parts = list(value)
    else:
        raise ValueError(f"{value!r} is not a GPU set; write '0-3', '0,2' or a list of indices")
    indices: list[int] = []
    for part in parts:
        indices.extend(_gpu_part(part))
    if len(set(indices)) != len(indices):
        raise ValueError(f"{value!r} names a GPU twice; list each index once")
    return tuple(indices)


def _gpu_part(part: Any) -> range:
    if isinstance(part, int) and not isinstance(part, bool) and part >= 0:
        return range(part, part + 1)
    match = _GPU_PART.fullmatch(part) if isinstance(part, str) else None
    if match is None:
        raise ValueError(
            f"{part!r} is not a GPU index or range; write 'N' or 'FIRST-LAST', e.g. '0-3'"
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise ValueError(f"{part!r} runs backwards; write the lower index first, e.g. '0-3'")
    return range(first, last + 1)


def host_port(value: str) -> tuple[str, int]:
    """``"10.0.0.1:8000"`` / ``"[::1]:8000"`` -> (host, port); ValueError saying why not."""
    parts = urlsplit("//" + value)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"{value!r}: the port must be a number within 0-65535") from None
    if not host or port is None or parts.path or parts.query or parts.username:
        raise ValueError(f"{value!r} is not HOST:PORT; write it like '10.0.0.1:8000'")
    return host, port


def _endpoint(value: str) -> str:
    host_port(value)
    return value


def _server_endpoint(value: str) -> str:
    """HOST:PORT, or a full http(s):// URL (kept as given)."""
    if value.startswith(("http://", "https://")):
        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError:
            raise ValueError(f"{value!r} has a malformed port") from None
        if not parts.hostname:
            raise ValueError(f"{value!r} has no host; write http://HOST:PORT")
        return value.rstrip("/")
    if "://" in value:
        raise ValueError(f"{value!r}: the server speaks http or https; write HOST:PORT")
    return _endpoint(value)


def _brokers(value: Any) -> str:
    listed = value.split(",") if isinstance(value, str) else value
    if not isinstance(listed, Sequence) or not listed:
        raise ValueError(f"{value!r}: list the Kafka bootstrap servers as HOST:PORT[,HOST:PORT]")
    for broker in listed:
        host_port(str(broker).strip())
    return ",".join(str(b).strip() for b in listed)


def _topic(value: str) -> str:
    if not _TOPIC.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a stream name; use letters, digits, '.', '_' and '-' (at most 249)"
        )
    return value


def _group(value: str) -> str:
    problem = group_name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
GpuSet = Annotated[tuple[int, ...], BeforeValidator(parse_gpus)]
Endpoint = Annotated[str, AfterValidator(_endpoint)]
Topic = Annotated[str, AfterValidator(_topic)]
GroupName = Annotated[str, AfterValidator(_group)]  # the buffers' one rule for group names


# ---------------------------------------------------------------------- sections


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuAllocation(_Section):
    """GPU indices per role (``gpu_allocation``). The co-located runner gives each role its
    set as ``CUDA_VISIBLE_DEVICES`` (:meth:`LoopConfig.cuda_visible_devices`); on CPU, and
    in the decoupled layout where every pod gets its GPUs from Kubernetes, it is unused.
    Overlapping sets are the co-located layout's time-sharing (the reference gives both
    roles 0-3)."""

    inference: GpuSet = ()
    training: GpuSet = ()


class TaskSchedule(_Section):
    """Co-located phases (``task_schedule``), seconds after parsing ``10ms`` / ``0.05s``:
    the server serves for ``inference_interval``, then holds while the trainer runs for
    ``training_interval``. Unused in the decoupled layout, where both run at once."""

    inference_interval: Duration = 0.010
    training_interval: Duration = 0.050


class InferenceCluster(_Section):
    """The policy servers (``inference_cluster``)."""

    endpoint: Annotated[str, AfterValidator(_server_endpoint)] = Field(
        default="127.0.0.1:8000",
        description="HOST:PORT of the server (or its Service): workers ask it for actions, "
        "the trainer pushes new versions to it; a full http(s):// URL is accepted too",
    )
    model: str | None = Field(
        default=None, description="the model to ask and push; None: the default"
    )
    request_timeout_s: float = Field(default=10.0, gt=0, description="one predict or push")
    lane: Path | None = Field(
        default=None,
        description="the server's local lane (rlserve serve --lane PATH), for workers on the "
        "server's host: predictions go through shared memory, and over HTTP if the lane is "
        "not there; None: HTTP only",
    )


class TrainingCluster(_Section):
    """The trainer (``training_cluster``)."""

    endpoint: Endpoint = Field(
        default="127.0.0.1:9400",
        description="HOST:PORT where the trainer's Prometheus /metrics is reached (the "
        "trainer listens on PORT at ``bind``; HOST is for whoever scrapes it)",
    )
    bind: str = Field(
        default="0.0.0.0", description="the address the trainer's /metrics listens on"
    )


class DataBuffer(_Section):
    """The experience buffer (``data_buffer``): ``type`` and its parts, or a whole ``url``."""

    type: BufferType | None = Field(
        default=None, description="default: memory when co-located, kafka when decoupled"
    )
    topic: Topic = Field(
        default=DEFAULT_TOPIC, description="the Kafka topic, Redis stream, log or memory name"
    )
    partition: PositiveInt = Field(default=16, description="Kafka: the topic's partition count")
    brokers: Annotated[str, BeforeValidator(_brokers)] = Field(
        default=DEFAULT_BROKERS, description="Kafka bootstrap servers, HOST:PORT[,HOST:PORT]"
    )
    redis: str = Field(default=DEFAULT_REDIS, description="Redis: HOST:PORT[/DB]")
    directory: Path = Field(
        default=DEFAULT_DIRECTORY, description="file: the logs' parent directory"
    )
    url: str | None = Field(
        default=None, description="a whole buffer URL; replaces type, topic, partition, brokers..."
    )
    group: GroupName = Field(default="trainer", description="the trainer's consumer group")
    consumer: Topic | None = Field(
        default=None, description="the trainer consumer's name (stable over restarts); <group>-0"
    )
    max_pending: PositiveInt = Field(
        default=100_000, description="records in flight: back-pressure"
    )
    publish_timeout_s: float = Field(default=5.0, ge=0, description="wait for room this long")
    overflow: Literal["block", "drop"] = "block"
    compression: Literal["zstd"] | None = None
    max_record_bytes: PositiveInt | None = Field(
        default=None,
        description="one record, decompressed, at most (unset: 64 MiB): a consumer skips "
        "larger ones",
    )

    @field_validator("redis")
    @classmethod
    def _redis_address(cls, value: str) -> str:
        host_port(value.split("/", 1)[0])
        return value

    @field_validator("directory")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{str(value)!r} is relative; give an absolute directory")
        return value

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in SCHEMES:
            raise ValueError(
                f"{value!r} is no buffer URL; use kafka://HOST:PORT/TOPIC?partitions=N, "
                "redis://HOST:PORT/DB?stream=NAME, file:///DIR or memory://NAME"
            )
        return value


class SyncPolicy(_Section):
    """The trainer's staleness bound (``sync_policy``): ``SyncController`` settings."""

    max_staleness: int | None = Field(
        default=None, ge=0, description="in published versions; None: unbounded (still measured)"
    )
    fallback_strategy: Literal["drop", "offline", "keep"] = "drop"
    offline_topic: Topic | None = Field(
        default=None, description="where 'offline' routes over-stale records; <topic>_offline"
    )


class Rollout(_Section):
    """Rollout workers (``rlserve collect``); not in the reference files."""

    env_id: str = Field(default="CartPole-v1", description="gymnasium environment id")
    num_envs: PositiveInt = Field(
        default=8, description="envs per worker, asked for in one request"
    )
    seed: int | None = None
    retry_for_s: float = Field(default=60.0, ge=0, description="retry a failing server or buffer")
    vectorization: Literal["auto", "sync", "async"] = "auto"


# ---------------------------------------------------------------------- the configuration


class LoopConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    config_file: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="YAML files, merged in order (later wins)"
    )
    cluster_mode: ClusterMode = "co-located"
    gpu_allocation: GpuAllocation = Field(default_factory=GpuAllocation)
    task_schedule: TaskSchedule = Field(default_factory=TaskSchedule)
    inference_cluster: InferenceCluster = Field(default_factory=InferenceCluster)
    training_cluster: TrainingCluster = Field(default_factory=TrainingCluster)
    data_buffer: DataBuffer = Field(default_factory=DataBuffer)
    sync_policy: SyncPolicy = Field(default_factory=SyncPolicy)
    rollout: Rollout = Field(default_factory=Rollout)
    admin_token: SecretStr | None = Field(
        default=None, description="the server's admin token, for pushing versions: environment only"
    )
    trainer: dict[str, Any] = Field(
        default_factory=dict,
        description="the trainer program's own settings, passed through unchecked",
    )

    @field_validator("config_file", mode="before")
    @classmethod
    def _file_list(cls, value: Any) -> Any:
        if isinstance(value, str | Path):
            return [p for p in str(value).split(os.pathsep) if p]
        return value

    @field_validator("admin_token")
    @classmethod
    def _one_word(cls, token: SecretStr | None) -> SecretStr | None:
        """As the server checks its own (serve/config.py): 16 characters, one word."""
        if token is None:
            return None
        if any(c.isspace() for c in token.get_secret_value()):
            raise ValueError("must not contain whitespace (a bearer token is one word)")
        if len(token.get_secret_value()) < 16:
            raise ValueError("must be 16 characters or more, as the server requires")
        return token

    @model_validator(mode="after")
    def _buffer_fits_the_mode(self) -> LoopConfig:
        if self.cluster_mode == "decoupled" and self.buffer_type == "memory":
            raise ValueError(
                "data_buffer.type: memory lives inside one process and cluster_mode "
                "decoupled runs separate processes; use kafka, redis, or file (one machine)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = _config_files_from(init_settings)
        server_token = os.environ.get(SERVER_TOKEN_ENV)
        fallback = {"admin_token": server_token} if server_token else {}
        return (
            init_settings,
            env_settings,
            InitSettingsSource(settings_cls, init_kwargs=fallback),
            # Not cli.config_file.MappingSource: this source matches top-level names as
            # keyword arguments are (case-insensitively), as the loop's files always have.
            InitSettingsSource(settings_cls, init_kwargs=read_files(files)),
        )

    # -- the buffer ----------------------------------------------------------------------

    @property
    def buffer_type(self) -> BufferType:
        """The buffer's kind: the URL's scheme, ``type``, or the mode's default."""
        if self.data_buffer.url is not None:
            return urlsplit(self.data_buffer.url).scheme  # type: ignore[return-value]
        if self.data_buffer.type is not None:
            return self.data_buffer.type
        return "memory" if self.cluster_mode == "co-located" else "kafka"

    @property
    def topic(self) -> str:
        """The stream's name, also when it comes from ``data_buffer.url``."""
        return _topic_of(self.consumer_buffer_url())

    @property
    def consumer_group(self) -> str:
        return self.data_buffer.group

    @property
    def consumer_name(self) -> str:
        """Stable across restarts, so a restarted trainer gets its uncommitted records."""
        return self.data_buffer.consumer or f"{self.data_buffer.group}-0"

    def consumer_buffer_url(self) -> str:
        """The trainer's buffer URL (its group goes to ``open_consumer``)."""
        if self.data_buffer.url is not None:
            return self.data_buffer.url
        b, kind = self.data_buffer, self.buffer_type
        if kind == "kafka":
            return f"kafka://{b.brokers}/{b.topic}?partitions={b.partition}"
        if kind == "redis":
            return f"redis://{b.redis}?stream={b.topic}"
        if kind == "file":
            return (b.directory / b.topic).as_uri()
        return f"memory://{b.topic}"

    def producer_buffer_url(self) -> str:
        """The workers' buffer URL: on Kafka it names the trainer's group, whose lag is the
        producers' back-pressure (``max_pending``); the other backends measure every group."""
        url = self.consumer_buffer_url()
        if self.buffer_type != "kafka" or "group" in dict(parse_qsl(urlsplit(url).query)):
            return url
        return _with_query(url, group=self.consumer_group)

    def offline_buffer_url(self) -> str | None:
        """Where ``fallback_strategy: offline`` routes over-stale records (the stream
        ``<topic>_offline`` by default, on the same buffer); None under another fallback."""
        if self.sync_policy.fallback_strategy != "offline":
            return None
        url = self.consumer_buffer_url()
        topic = self.sync_policy.offline_topic or _topic_of(url) + OFFLINE_SUFFIX
        return _with_topic(url, topic)

    def buffer_options(self) -> BufferOptions:
        from loop.buffers.base import BufferOptions, Overflow

        b = self.data_buffer
        limit = {} if b.max_record_bytes is None else {"max_record_bytes": b.max_record_bytes}
        return BufferOptions(
            max_pending=b.max_pending,
            overflow=Overflow(b.overflow),
            publish_timeout_s=b.publish_timeout_s,
            compression=b.compression,
            **limit,
        )

    # -- the server, the controller, the trainer -------------------------------------------

    def server_url(self) -> str:
        """The policy server's base URL, for workers' requests and the trainer's pushes."""
        endpoint = self.inference_cluster.endpoint
        return endpoint if "://" in endpoint else f"http://{endpoint}"

    def sync_controller_kwargs(self) -> dict[str, Any]:
        """``SyncController(consumer, **kwargs, offline=...)``'s policy arguments."""
        from loop.controller import Fallback

        policy = self.sync_policy
        return {
            "max_staleness": policy.max_staleness,
            "fallback": Fallback(policy.fallback_strategy),
        }

    def open_sync_controller(
        self, metrics: LoopMetrics | None = None, version: int = 0
    ) -> TrainerSide:
        """The trainer's consumer (group ``consumer_group``, name ``consumer_name``), the
        offline producer when the fallback routes, and the controller over them; close the
        returned :class:`TrainerSide` (or use it as a context manager) when done."""
        from loop.buffers import open_consumer, open_producer
        from loop.controller import SyncController

        options = self.buffer_options()
        consumer = open_consumer(
            self.consumer_buffer_url(), self.consumer_group, self.consumer_name, options
        )
        offline_url = self.offline_buffer_url()
        offline = None
        try:
            if offline_url is not None and self.sync_policy.max_staleness is not None:
                offline = open_producer(offline_url, options)
            controller = SyncController(
                consumer, **self.sync_controller_kwargs(), offline=offline, metrics=metrics,
                version=version,
            )  # fmt: skip
        except BaseException:
            consumer.close()
            if offline is not None:
                offline.close()
            raise
        return TrainerSide(controller, consumer, offline)

    def trainer_metrics_address(self) -> tuple[str, int]:
        """(bind address, port) for the trainer's ``LoopMetrics.serve_metrics``: the port
        of ``training_cluster.endpoint``, on ``training_cluster.bind``."""
        _, port = host_port(self.training_cluster.endpoint)
        return self.training_cluster.bind, port

    def cuda_visible_devices(self, role: Role) -> str:
        """``CUDA_VISIBLE_DEVICES`` for a role: ``"0,1,2,3"``; ``""`` when none is set."""
        gpus = getattr(self.gpu_allocation, role)
        return ",".join(map(str, gpus))

    def resolved(self) -> dict[str, Any]:
        """What this configuration means, as JSON-ready values (``python -m loop.config``)."""
        return {
            "cluster_mode": self.cluster_mode,
            "server_url": self.server_url(),
            "model": self.inference_cluster.model,
            "buffer": {
                "type": self.buffer_type,
                "producer_url": _masked(self.producer_buffer_url()),
                "consumer_url": _masked(self.consumer_buffer_url()),
                "offline_url": _masked(self.offline_buffer_url()),
                "group": self.consumer_group,
                "consumer": self.consumer_name,
            },
            "sync_controller": {
                "max_staleness": self.sync_policy.max_staleness,
                "fallback": self.sync_policy.fallback_strategy,
            },
            "task_schedule_s": self.task_schedule.model_dump(),
            "cuda_visible_devices": {
                role: self.cuda_visible_devices(role) for role in ("inference", "training")
            },
            "trainer_metrics": "{}:{}".format(*self.trainer_metrics_address()),
            "rollout": self.rollout.model_dump(),
            "admin_token": "set" if self.admin_token is not None else None,
        }


@dataclass(frozen=True, slots=True)
class TrainerSide:
    """What :meth:`LoopConfig.open_sync_controller` opened; ``close`` closes the clients."""

    controller: SyncController
    consumer: Consumer
    offline: Producer | None

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            if self.offline is not None:
                self.offline.close()

    def __enter__(self) -> TrainerSide:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- URLs


def _topic_of(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "kafka":
        return parts.path.strip("/") or DEFAULT_TOPIC
    if parts.scheme == "redis":
        return dict(parse_qsl(parts.query)).get("stream") or DEFAULT_TOPIC
    if parts.scheme == "file":
        return PurePosixPath(parts.path).name
    return parts.netloc + parts.path


def _with_topic(url: str, topic: str) -> str:
    """``url`` with its stream renamed; a Kafka producer's back-pressure group dropped (the
    offline stream's consumers are not the trainer)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "group"]
    if parts.scheme == "kafka":
        return urlunsplit(parts._replace(path="/" + topic, query=urlencode(query, safe=",")))
    if parts.scheme == "redis":
        query = [(k, v) for k, v in query if k != "stream"] + [("stream", topic)]
        return urlunsplit(parts._replace(query=urlencode(query, safe=",")))
    if parts.scheme == "file":
        path = str(PurePosixPath(parts.path).with_name(topic))
        return urlunsplit(parts._replace(path=path))
    return f"memory://{topic}"


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query, safe=",")))


def _masked(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    query = [
        (k, "***" if re.search(r"password|secret|token", k) else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    netloc = parts.netloc
    if parts.password:
        netloc = netloc.replace(":" + parts.password + "@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe=",*")))


# ---------------------------------------------------------------------- files


def _config_files_from(init_settings: PydanticBaseSettingsSource) -> list[Path]:
    given = init_settings().get("config_file") or os.environ.get(ENV_PREFIX + "CONFIG_FILE")
    if not given:
        return []
    if isinstance(given, str | Path):
        given = [p for p in str(given).split(os.pathsep) if p]
    return [Path(p) for p in given]


def read_files(files: Sequence[Path]) -> dict[str, Any]:
    """The files' settings merged in order, section by section (a later file wins)."""
    return merged(_read_one(path) for path in files)


def _read_one(path: Path) -> dict[str, Any]:
    """One file's settings (``cli.config_file`` reads it and refuses a file that is
    missing, not YAML or not a mapping), refusing what only a loop file may not hold."""
    raw = read_yaml(path)
    for name in _FILE_ONLY:
        if name in raw:
            raise ConfigError(
                f"{path}: {name} is not read from files (anyone who can read the file or its "
                f"ConfigMap would hold it); set {ENV_PREFIX}{name.upper()} or "
                f"{SERVER_TOKEN_ENV} (a Kubernetes Secret) instead"
            )
    if "config_file" in raw:
        raise ConfigError(f"{path}: config_file may not name more files; list them all in load")
    return raw


# ---------------------------------------------------------------------- loading


def load(*config_files: str | Path, **overrides: Any) -> LoopConfig:
    """The loop's settings from ``overrides`` (None meaning 'not given'; sections as
    dicts), the environment, and ``config_files`` (else ``RLSERVE_LOOP_CONFIG_FILE``)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if config_files:
        given["config_file"] = [Path(p) for p in config_files]
    try:
        return LoopConfig(**given)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        where = ".".join(loc) or "settings"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            message = f"unknown field; valid here: {', '.join(valid)}"
        if not loc:  # a rule across sections: the message names its fields
            parts.append(message)
        elif where.startswith("admin_token"):  # never echoed
            parts.append(f"{where}: {message}")
        else:
            parts.append(f"{where}: {message} (got {err.get('input')!r})")
    return "invalid loop configuration: " + "; ".join(parts)


def _fields_at(loc: tuple[str, ...]) -> list[str]:
    """The field names a section at ``loc`` accepts."""
    model: type[BaseModel] = LoopConfig
    for name in loc:
        annotation = model.model_fields[name].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [n for n in model.model_fields if n != "config_file"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loop.config FILE...``: what the files (and the environment) mean."""
    files = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load(*files)
    except ConfigError as exc:
        print(f"loop.config: error: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(config.resolved(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
