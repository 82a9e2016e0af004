"""The server's one typed configuration.

Each setting is declared once, below: name, type, default, bounds and description. The
fields a model may override are :class:`ModelSettings`'s, which :class:`Settings` inherits.

Sources, highest precedence first:

1. command-line flags of ``rlserve serve`` (and keyword arguments to :func:`load`): a flag
   per setting, generated from these fields (``--max-batch-size`` for ``max_batch_size``,
   its help the description; ``serve.commands.serve`` says which settings have none);
2. environment variables ``RLSERVE_<FIELD>`` (e.g. ``RLSERVE_MAX_BATCH_SIZE=64``;
   lists as JSON, e.g. ``RLSERVE_PROVIDERS='["CUDAExecutionProvider"]'``);
3. the YAML file named by ``--config`` / ``RLSERVE_CONFIG_FILE`` (settings by name, or the
   service guide's ``service:``/``model:`` sections: see ``serve.config_file``);
4. the defaults below.

Per model, ``<model_repository>/<model>/config.yaml`` may override the fields of
:class:`ModelSettings` (batching, deadline, version policy, observation bounds, result
cache) for that model alone.

Nothing is read at import time: settings exist once :func:`load` is called.
"""

from __future__ import annotations

import importlib.util
import os
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from cli import config_file
from kernel.errors import ConfigError
from kernel.spaces import ObservationBounds
from kernel.versions import MAX_VERSION
from serve.config_file import ConfigFileSource
from serve.types import CanaryMode, GateAction

ENV_PREFIX = "RLSERVE_"
ADMIN_TOKEN_MIN_CHARS = 16  # a bearer token short enough to guess is refused at start
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
_BOUNDS_HELP = (
    "an observation value outside its Box's declared bounds: allow (serve it as given), "
    "clip (into [low, high] before the model runs) or reject (422); counted in "
    "rlserve_observations_out_of_bounds_total either way. Shape, dtype, finiteness and "
    "discrete indices are checked whatever this says"
)

_SEQUENCES_HELP = "language models: sequences decoded together, at most"
_HELD_SEQUENCES_HELP = (
    "recurrent policies: live sequences (episodes) whose state the server holds, at most; "
    "a new one evicts the least recently used idle one of its own sequence_owner (or any "
    "idle past sequence_idle_timeout_s), never another owner's live one"
)
_SEQUENCES_PER_OWNER_HELP = (
    "recurrent policies: held sequences of one sequence_owner key (those started without one "
    "count as one owner), at most; a new one past it evicts that owner's least recently used "
    "idle one (429 when each has a step in flight), never another owner's; unset: one owner "
    "may fill max_held_sequences"
)
_SEQUENCE_IDLE_HELP = (
    "recurrent policies: a held sequence with no step for this long is evicted (its next "
    "step is refused, saying so)"
)
_GENERATION_DEADLINE_HELP = (
    "language models: per-request deadline of generate, score and the OpenAI routes "
    "(a generation takes many decoding steps; default_deadline_ms is for one forward pass)"
)
_BATCH_TOKENS_HELP = (
    "language models: key/value-cache tokens a decoding batch may come to hold, padded: its "
    "sequences times the longest prompt plus max_new_tokens among them (every row of the "
    "cache is as long as the longest; a request larger than this runs alone)"
)
_PREFILL_HELP = (
    "language models: prompt tokens prefilled at one step boundary, which the running "
    "sequences wait for (the first newcomer of a boundary is always prefilled)"
)
_ANSWER_TOKENS_HELP = (
    "language models: token entries one answer may carry, at most: its choices times each "
    "one's new tokens (and echoed prompt tokens) times 1 + top_logprobs (scores: the "
    "completions' tokens times 1 + top_logprobs); a call whose product is larger is refused "
    "(422; 400 on the OpenAI routes) before it queues"
)
_RESULT_CACHE_HELP = (
    "serve repeated deterministic predict answers from this Redis (redis://host:port/db, "
    "rediss://, unix://; needs pip install 'rlserve[cache]'), keyed by model, version, "
    "sha256, the validated observations and the requested outputs; sampled or seeded "
    "requests always run the model. Unset: no cache (docs/serving.md, Result cache)"
)
_RESULT_CACHE_TTL_HELP = "result cache: a stored answer expires this long after it was stored"
_RESULT_CACHE_ENTRY_HELP = "result cache: answers longer than this (encoded JSON) are not stored"
_RESULT_CACHE_TIMEOUT_HELP = (
    "result cache: a lookup unanswered after this runs the model instead (counted as an error)"
)


def _redis_url(url: str, needed_by: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            "expected a Redis URL: redis://host:port/db, rediss://host:port/db or "
            "unix:///path/to/redis.sock"
        )
    if importlib.util.find_spec("redis") is None:
        raise ValueError(f"{needed_by} needs the Redis client: pip install 'rlserve[cache]'")
    return url


ResultCacheUrl = Annotated[str, AfterValidator(lambda url: _redis_url(url, "the result cache"))]


def _feature_store_url(url: str) -> str:
    """A Redis URL (plain hashes), or ``feast:///path/to/feature_repo`` (Feast's SDK)."""
    if not url.startswith(FEAST_SCHEME):
        return _redis_url(url, "a feature store")
    if not url[len(FEAST_SCHEME) :].startswith("/"):
        raise ValueError(
            "expected feast:///absolute/path/to/feature_repo (the folder of feature_store.yaml)"
        )
    if importlib.util.find_spec("feast") is None:
        raise ValueError("a Feast feature store needs its SDK: pip install 'feast[redis]'")
    return url


FEAST_SCHEME = "feast://"
FeatureStoreUrl = Annotated[str, AfterValidator(_feature_store_url)]


class VersionPolicy(BaseModel):
    """Which versions of a model to load (Triton's vocabulary): the newest N, or a list."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    latest: PositiveInt | None = 1
    specific: list[int] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> VersionPolicy:
        if self.specific is not None and self.latest not in (None, 1):
            raise ValueError("set either latest or specific, not both")
        return self


_FEATURES_HELP = (
    "online features: observations assembled from a feature store by entity id (an object: "
    "store, entity, features, defaults, timeout_ms; docs/serving.md, Online features). "
    "Unset: requests carry their observations"
)
_ENTITY = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"


class FeatureLayout(StrEnum):
    """How plain Redis holds an entity's features at ``<key_prefix><id>``."""

    HASH = "hash"  # a hash, one field per feature, its value as text (HSET e:42 x 0.5 ...)
    FLOAT32 = "float32"  # a string: the features as little-endian float32, in order


class FeatureView(BaseModel):
    """A model's observations as features of an entity in an online store: plain Redis
    hashes, one per entity at ``<key_prefix><id>`` (default prefix ``<entity>:``), one field
    per feature holding its value as text (``HSET player:42 hp 10 x 0.5``); or a Feast
    feature repository (``feast:///path``), whose features are named as Feast names them
    (``cart_state:x``) and whose entity is the join key (``cart_id``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    store: FeatureStoreUrl = Field(
        description="redis://host:port/db (rediss, unix): plain hashes; or feast:///repo_path"
    )
    entity: str = Field(pattern=_ENTITY, description="the entity key's name, e.g. player_id")
    key_prefix: str | None = Field(None, description="hash key prefix (default: '<entity>:')")
    features: list[str] | dict[str, list[str]] = Field(
        min_length=1,
        description="feature names, in the order of the observation's values; for a Dict "
        "observation space, an object of each observation key's features",
    )
    defaults: dict[str, float] = Field(
        default_factory=dict,
        description="a missing feature's value; a feature without one refuses the request",
    )
    timeout_ms: float = Field(5.0, gt=0, description="the store must answer within this")
    overridable: list[str] = Field(
        default_factory=list,
        description="features a request may give itself (its features), over the stored ones",
    )
    layout: FeatureLayout = Field(
        FeatureLayout.HASH, description="plain Redis: hash (text fields) or float32 (packed)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> FeatureView:
        features = self.columns
        empty = [key for key, names in self.parts if not names]
        if empty:
            raise ValueError(f"features: the observation keys {empty} list no features")
        repeated = sorted({f for f in features if features.count(f) > 1})
        if repeated:
            raise ValueError(f"features: {repeated} appear more than once")
        unknown = sorted(set(self.defaults) - set(features))
        if unknown:
            raise ValueError(f"defaults: {unknown} are not among the features {features}")
        foreign = sorted(set(self.overridable) - set(features))
        if foreign:
            raise ValueError(f"overridable: {foreign} are not among the features {features}")
        unnamed = [f for f in features if ":" not in f]
        if self.feast and unnamed:
            raise ValueError(
                f"features: {unnamed} name no feature view; a Feast store's features are "
                "named view:feature, as Feast's get_online_features takes them"
            )
        return self

    @cached_property
    def columns(self) -> list[str]:
        """Every feature, in the order of the values the store's rows hold (a Dict space's
        keys one after another, as the view lists them)."""
        if isinstance(self.features, list):
            return list(self.features)
        return [name for names in self.features.values() for name in names]

    @cached_property
    def parts(self) -> list[tuple[str, list[str]]]:
        """A Dict space's observation keys, each with its features; empty for a flat view."""
        return [] if isinstance(self.features, list) else list(self.features.items())

    @property
    def feast(self) -> bool:
        return self.store.startswith(FEAST_SCHEME)

    @property
    def prefix(self) -> str:
        return f"{self.entity}:" if self.key_prefix is None else self.key_prefix


class CanarySettings(BaseModel):
    """A policy canary (docs/rollouts.md): a version serving a share of a model's episodes
    beside the live one (or, in shadow, run on a share of its batches), and its gate. An
    admin call's body, and a model's ``canary`` in its config.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: StrictInt = Field(ge=1, le=MAX_VERSION, description="the canary's version")
    share: float = Field(gt=0, lt=1, description="of episodes (in shadow: of live batches)")
    mode: CanaryMode = Field(CanaryMode.EPISODES, description="episodes or shadow")
    action: GateAction = Field(GateAction.REPORT, description="report, or auto: the gate acts")
    margin: float = Field(0.0, ge=0, description="how much lower a promoted mean return may be")
    alpha: float = Field(0.05, gt=0, lt=1, description="the chance of a wrong verdict")
    min_episodes: StrictInt = Field(30, ge=2, description="per version, before any verdict")
    planned_episodes: StrictInt = Field(1000, ge=4, description="where the interval is tuned")


_CANARY_HELP = (
    "a policy canary started with the model (an object: version, share, mode, action, "
    "margin, alpha, min_episodes, planned_episodes; docs/rollouts.md), once: a canary the "
    "serving state says ended is not started again. Unset: none"
)


class ModelSettings(BaseModel):
    """The settings a model's own config.yaml may override; :class:`Settings` inherits them
    (declared here once), so the server's values are every model's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # Batching and deadlines.
    max_batch_size: PositiveInt = Field(32, description="rows in one batch, at most")
    max_wait_ms: float = Field(
        0.0, ge=0, description="wait this long for a fuller batch (0: run as soon as idle)"
    )
    max_queue_rows: PositiveInt = Field(1024, description="queued rows before 429")
    default_deadline_ms: float = Field(1000.0, gt=0, description="per-request deadline")
    inline_max_ms: float = Field(
        0.5,
        ge=0,
        description="run batches on the event loop while they average less (0: always on a thread)",
    )
    version_policy: VersionPolicy = Field(
        default_factory=VersionPolicy,
        description="versions to load: {latest: N} (the newest N) or {specific: [versions]}",
    )
    observation_bounds: ObservationBounds = Field(ObservationBounds.ALLOW, description=_BOUNDS_HELP)
    # Recurrent policies whose memory the server holds (sequence_id; serve.batching.sequences).
    max_held_sequences: PositiveInt = Field(4096, description=_HELD_SEQUENCES_HELP)
    max_sequences_per_owner: PositiveInt | None = Field(None, description=_SEQUENCES_PER_OWNER_HELP)
    sequence_idle_timeout_s: float = Field(60.0, gt=0, description=_SEQUENCE_IDLE_HELP)
    # Language models (continuous batching; max_queue_rows counts waiting requests there).
    generation_deadline_ms: float = Field(60000.0, gt=0, description=_GENERATION_DEADLINE_HELP)
    max_sequences: PositiveInt = Field(32, description=_SEQUENCES_HELP)
    max_batch_tokens: PositiveInt = Field(16384, description=_BATCH_TOKENS_HELP)
    max_prefill_tokens: PositiveInt = Field(2048, description=_PREFILL_HELP)
    max_answer_tokens: PositiveInt = Field(65536, description=_ANSWER_TOKENS_HELP)
    # The result cache (serve.stores.result_cache): off unless result_cache is set.
    result_cache: ResultCacheUrl | None = Field(None, description=_RESULT_CACHE_HELP)
    result_cache_ttl_s: float = Field(60.0, gt=0, description=_RESULT_CACHE_TTL_HELP)
    result_cache_max_entry_bytes: PositiveInt = Field(65536, description=_RESULT_CACHE_ENTRY_HELP)
    result_cache_timeout_ms: float = Field(5.0, gt=0, description=_RESULT_CACHE_TIMEOUT_HELP)
    # Online features (serve.stores.features): off unless features is set.
    features: FeatureView | None = Field(None, description=_FEATURES_HELP)
    # A policy canary declared with the model (serve.control.canary_assignment).
    canary: CanarySettings | None = Field(None, description=_CANARY_HELP)


class Settings(BaseSettings, ModelSettings):
    """Every setting: the server's own below, and every model's defaults (inherited from
    :class:`ModelSettings`, declared there once)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    config_file: Path | None = Field(None, description="YAML file with any of these settings")
    model_repository: Path = Field(
        Path("model_repository"), description="folder laid out as <model>/<version>/model.onnx"
    )
    model_file: Path | None = Field(
        None,
        description="serve this one exported ONNX file instead of model_repository "
        "(read-only: no live updates); the service guide's model.path",
    )
    default_model: str | None = Field(
        None, description="served at POST /predict; default: the only model"
    )
    host: str = Field("127.0.0.1", description="the address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="the HTTP port to listen on")
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="also serve the Open Inference Protocol over gRPC on this port, at host "
        "(Triton uses 8001); unset: no gRPC",
    )
    grpc_stream_max_in_flight: PositiveInt = Field(
        64,
        description="calls of one gRPC ModelStreamInfer stream read but not yet answered, at "
        "most (computed answers the client has not read count): at the bound the stream is "
        "not read until an answer is written, so a client that writes without reading is "
        "held back by gRPC's flow control",
    )
    workers: PositiveInt = Field(
        2,
        description="gunicorn worker processes; `rlserve serve` runs one process unless "
        "workers is given, and more than 1 runs gunicorn (serve/process/gunicorn_conf.py, these "
        "settings passed on)",
    )
    max_body_bytes: PositiveInt = Field(
        4 * 1024 * 1024,
        description="larger bodies get 413 (predict, /v2 infer; also the largest gRPC message)",
    )

    # Triton's system shared-memory extension (serve/frontends/oip/shared_memory.py).
    allow_client_shm: bool = Field(
        False,
        description="serve Triton's system shared-memory extension on /v2 and gRPC (Triton's "
        "--allow-client-shm): clients register POSIX shared-memory objects of /dev/shm that "
        "the server then reads inputs from and writes outputs to, so turn it on only where "
        "every client that reaches the ports may use this server user's shared memory, or "
        "set admin_token, which then guards it (shm_open)",
    )
    shm_open: bool = Field(
        False,
        description="let any client that reaches the ports register, list and unregister "
        "system shared-memory regions and name them in calls, even with admin_token set "
        "(which otherwise guards them: Authorization: Bearer <admin_token>); only for a "
        "trusted single-tenant host",
    )
    shm_max_regions: PositiveInt = Field(
        64, description="system shared-memory regions registered at once, per server process"
    )
    shm_max_region_bytes: PositiveInt = Field(
        1024 * 1024 * 1024, description="the largest system shared-memory region registered"
    )

    # The local lane (serve/frontends/lane/, docs/lane.md).
    lane: Path | None = Field(
        None,
        description="also serve the local lane at this Unix socket path: processes of this "
        "user on this host call with arrays in shared memory, no HTTP (PolicyClient(url, "
        "lane=PATH), rlserve collect --lane PATH); one server process only (workers 1); "
        "unset: no lane",
    )
    lane_max_rows: PositiveInt = Field(
        4096,
        description="the most rows one local-lane call may carry (a lane's slot is "
        "sized for the rows its client says it will send, up to this)",
    )
    lane_max_connections: PositiveInt = Field(
        256, description="local-lane clients connected at once, per server process"
    )
    lane_serving: Literal["thread", "loop"] = Field(
        "thread",
        description="how local-lane calls are served: thread (a serving thread waits on "
        "every lane's doorbell and runs the calls that rang together as one batch, no "
        "asyncio per call; lanes of server-held sequences stay on the loop) or loop (each "
        "call takes the event loop's call steps into the model's dynamic batcher, as HTTP "
        "and gRPC calls do)",
    )
    lane_spin_us: NonNegativeFloat = Field(
        100.0,
        description="with lane_serving thread: how long the serving thread looks for the "
        "next call in the lanes' slots after each batch before it sleeps on their doorbells "
        "(a call in that window costs no wake-up; the thread keeps the core busy that "
        "long); 0: sleep at once, for hosts where a spinning core costs more than latency",
    )

    # Live policy updates (see docs/updates.md).
    admin_token: SecretStr | None = Field(
        None,
        description=f"bearer token for push/activate/rollback/hold ({ADMIN_TOKEN_MIN_CHARS} "
        "characters or more, no whitespace), and for system shared memory unless shm_open; "
        "unset disables the updates",
    )
    episode_token: SecretStr | None = Field(
        None,
        description="bearer token episode reports (POST /v1/models/{model}/episodes) must "
        "carry; unset: the route is open (docs/rollouts.md)",
    )
    poll_interval_s: float | None = Field(
        None,
        gt=0,
        description="watch the repository for new versions and models this often (pull mode); "
        "unset: no polling",
    )
    sync_interval_s: float = Field(
        1.0,
        gt=0,
        description="every worker applies the repository's serving state this often: a push, "
        "activation, rollback or hold reaches every worker within it plus the load time",
    )
    resident_versions: PositiveInt = Field(2, description="versions kept loaded per model")
    max_model_bytes: PositiveInt = Field(256 * 1024 * 1024, description="largest pushed model")

    # onnxruntime.
    providers: list[str] | Literal["auto"] = Field(
        "auto", description="execution providers in order; auto = GPU providers present, then CPU"
    )
    allow_cpu_fallback: bool = Field(
        False, description="stay ready when a requested GPU provider is inactive"
    )
    intra_op_threads: int = Field(
        1, ge=0, description="onnxruntime threads within one operator, per session (0: its default)"
    )
    inter_op_threads: int = Field(
        1, ge=0, description="onnxruntime threads across operators, per session (0: its default)"
    )
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        "all", description="onnxruntime graph optimisation"
    )
    gpu_memory_limit_bytes: PositiveInt | None = Field(
        None,
        description="cap on the CUDA provider's memory arena (gpu_mem_limit, grown by what is "
        "asked: kSameAsRequested) and on TensorRT's workspace, for servers sharing a GPU; "
        "unset: onnxruntime's defaults (no arena limit)",
    )

    # Shutdown: see serve/process/phases.py for the order.
    drain_delay_s: float = Field(
        0.0,
        ge=0,
        description="keep answering after SIGTERM with /ready 503 (the Kubernetes manifests "
        "set 5: time for endpoints to drop the pod; an interactive stop needs none)",
    )
    graceful_timeout_s: float = Field(30.0, gt=0, description="longest wait for in-flight work")
    stuck_batch_s: float = Field(30.0, gt=0, description="/health fails when a batch runs longer")

    # Logging.
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the least severe log lines written"
    )
    access_log: bool = Field(True, description="a JSON line on stdout per request")

    # HTTP.
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request's line and headers must arrive within this (408, closed)",
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="a request's body must arrive within this after its headers"
    )
    http_data_plane: Literal["protocol", "asgi"] = Field(
        "protocol",
        description="how GET and POST calls to the data plane's routes (predict, /v2, the "
        "language models' own) are answered: protocol (rlserve's HTTP protocol gives each a "
        "lean request cycle of its own and calls the data-plane application directly) or "
        "asgi (through uvicorn's request cycle, as the control routes always are); the "
        "answers are the same",
    )
    proxy_headers: bool = Field(
        False,
        description="trust X-Forwarded-For/-Proto from the addresses in gunicorn's "
        "forwarded_allow_ips (127.0.0.1 for `rlserve serve`): the access log then shows the "
        "client behind the proxy",
    )

    @model_validator(mode="after")
    def _two_ports(self) -> Settings:
        if self.lane is not None and self.workers > 1 and "workers" in self.model_fields_set:
            raise ValueError(
                f"lane {str(self.lane)!r} with workers {self.workers}: the local lane is served "
                "by one server process; serve it with workers 1 (one process per core, each "
                "with a lane of its own path, scales the same way)"
            )
        if self.grpc_port is not None and self.grpc_port == self.port != 0:
            raise ValueError(
                f"grpc_port {self.grpc_port} is the HTTP port too; give gRPC a port of its own "
                "(Triton's is 8001)"
            )
        return self

    @field_validator("admin_token")
    @classmethod
    def _one_long_word(cls, token: SecretStr | None) -> SecretStr | None:
        """Never echoes the token: the message says what is wrong and what would do."""
        if token is None:
            return None
        secret = token.get_secret_value()
        if any(c.isspace() for c in secret):
            raise ValueError("must not contain whitespace (a bearer token is one word)")
        if len(secret) < ADMIN_TOKEN_MIN_CHARS:
            raise ValueError(
                f"must be {ADMIN_TOKEN_MIN_CHARS} characters or more, this one has "
                f"{len(secret)}; `openssl rand -hex 16` makes one of 32"
            )
        return token

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        config_file = _config_file_from(init_settings)
        if config_file is not None:
            sources += (ConfigFileSource(settings_cls, config_file),)
        return sources

    def for_model(self, overrides: dict[str, Any]) -> ModelSettings:
        """This server's defaults, with a model's own config.yaml on top."""
        base = {name: getattr(self, name) for name in ModelSettings.model_fields}
        try:
            return ModelSettings.model_validate({**base, **overrides})
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None


def _config_file_from(init_settings: PydanticBaseSettingsSource) -> Path | None:
    given = init_settings().get("config_file") or os.environ.get(ENV_PREFIX + "CONFIG_FILE")
    if given is None:
        return None
    path = Path(given)
    if not path.is_file():
        raise ConfigError(f"config_file: {path} does not exist; give the path of a YAML file")
    return path


def load(**overrides: Any) -> Settings:
    """Settings from flags (``overrides``, None meaning 'not given'), env and the config file."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_version_view(path: Path) -> FeatureView | None:
    """A version's own features view (its ``features.yaml``: the fields of a model's
    ``features``), over its model's; None when absent."""
    if not path.is_file():
        return None
    try:
        return FeatureView.model_validate(config_file.read(path))
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None


def load_model_overrides(path: Path) -> dict[str, Any]:
    """A model's config.yaml, checked against ModelSettings' fields; {} when absent."""
    if not path.is_file():
        return {}
    raw = config_file.read(path)
    unknown = sorted(set(raw) - set(ModelSettings.model_fields))
    if unknown:
        raise ConfigError(
            f"{path}: unknown settings {unknown}; "
            f"a model may set {sorted(ModelSettings.model_fields)}"
        )
    return raw


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        secret = where in _SECRETS
        given = "" if secret else f" (got {err.get('input')!r})"
        parts.append(f"{where}: {err['msg']}{given}")
    return "invalid configuration: " + "; ".join(parts)


# Never echoed in an error message (a Redis URL may hold a password).
_SECRETS = {"admin_token", "result_cache"}
