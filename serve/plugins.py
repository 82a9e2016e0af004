"""Model kinds as plug-ins: what a kind gives the server, and where the server finds it.

A kind of model (a policy of rows, a language model) is one folder under ``serve/`` with a
module that declares ``PLUGIN``, a :class:`KindPlugin`, and one member of
:class:`~serve.dataplane.kinds.ModelKind` that names that module: the registry is that
enum. The control plane and the process look a kind up here (:func:`plugin_of`) and import
no concrete kind, so adding a kind touches its folder and one line
(docs/architecture.md, "Adding a model kind").

A plug-in says, for its kind:

- which version folders hold it, told before any version loads (:attr:`KindPlugin.claims`),
  and which contract kind in a model file's metadata it loads (``contract_kind``);
- how a version loads (``load``), what a pushed version must show before it replaces the
  live one (``check_update``), which scheduler serves it (``scheduler``) and a call's
  deadline when it names none (``default_deadline_ms``);
- what its versions keep per model (server-held sequences, features views);
- its metrics (``metrics``: the sink its scheduler reports to, registered once per
  server) and what it answers itself (``frontends``: routes of its own, which the process
  puts after the shared transports', and how its models answer the shared predict routes).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from starlette.types import Receive, Scope, Send

from serve.dataplane.kinds import ModelKind

if TYPE_CHECKING:
    from serve.batching.record import RecordSink
    from serve.batching.sequences import SequenceTable
    from serve.config import ModelSettings, Settings
    from serve.dataplane.deadline import LoopTurn
    from serve.dataplane.messages import Prepared
    from serve.dataplane.model import ServedModel, VersionSource
    from serve.dataplane.routing import Router
    from serve.dataplane.scheduler import Scheduler
    from serve.execution.runtime import Session
    from serve.frontends.http_calls import HttpCalls, Responder
    from serve.frontends.openapi import OpenApiPart
    from serve.metrics import Metrics


class Claim(Enum):
    """How a kind answers 'is this version folder yours?', before anything loads."""

    NO = "no"
    FALLBACK = "fallback"  # any model file: the kind a folder is when no other claims it
    YES = "yes"  # the folder has what only this kind has (a tokenizer)


@dataclass(frozen=True)
class VersionFiles:
    """A version being loaded: its file, opened in a session, and what it is named."""

    name: str
    version: int
    path: Path  # the model file (``model.onnx``); the folder holds what else it needs
    session: Session
    sha256: str
    started: float  # monotonic seconds, when loading began: the log says how long it took


@dataclass(frozen=True)
class Canary:
    """Observations (and optionally the actions taken) with the log-probs the new version
    must reproduce within ``atol``: what a push may ask its kind to check."""

    observations: Any
    log_probs: list[float]
    actions: Any = None
    atol: float = 1e-5


@dataclass(frozen=True)
class Comparison:
    """Two versions of a model on the same batch (a shadow canary's evidence): how many
    rows, on how many the canary's action agreed with the live one's, and the sum over rows
    of KL(live || canary) of their action distributions (None: the kind or the policy has
    none)."""

    rows: int
    agreeing: int
    kl_sum: float | None


# a kind's comparison of two versions on a batch's inputs and requests
Compare: TypeAlias = (
    "Callable[[ServedModel, ServedModel, dict[str, Any], Sequence[Prepared]], Comparison]"
)


@dataclass(frozen=True)
class SchedulerParts:
    """What a kind's scheduler is built from: the model, its versions and where it reports."""

    name: str
    versions: VersionSource
    settings: ModelSettings
    metrics: Metrics
    sinks: Sequence[RecordSink]  # every executed batch's record, for kinds that batch rows


@dataclass(frozen=True)
class FrontendParts:
    """What a kind's own frontends are built from (the process holds one of each)."""

    router: Router
    kind_of: Callable[[str | None], ModelKind | None]
    http_calls: HttpCalls
    settings: Settings
    turn: LoopTurn


# An entry of the process's route table: a path that starts with one of ``prefixes`` is
# asked of ``match`` (the parsed path, else None: not the entry's), and ``answer`` answers
# the call with what it parsed. The prefixes keep a call from crossing every frontend's
# module on its way to its own.
Answer = Callable[[Scope, Receive, Send, Any], Awaitable[None]]
# ``now``, where an entry has it, answers a call whose whole body has arrived without a task
# (``HttpCalls.answer_now``), or says False: ``answer`` then answers it.
AnswerNow = Callable[[Scope, bytes, "Responder", Any], bool]


@dataclass(frozen=True)
class RouteEntry:
    prefixes: tuple[str, ...]
    match: Callable[[str], Any | None]
    answer: Answer
    now: AnswerNow | None = None


@dataclass(frozen=True)
class KindRoutes:
    """What a kind answers itself: routes of its own, and how it answers the shared predict
    routes for its models (None: the predict frontend answers them)."""

    own: Sequence[RouteEntry] = ()
    predict: Answer | None = None  # called with the predict frontend's parsed path


@dataclass(frozen=True)
class KindPlugin:
    kind: ModelKind
    contract_kind: str  # the policy contract's ``kind`` in a model file's metadata
    claims: Callable[[Path | None], Claim]  # a version folder (None: no version yet)
    load: Callable[[VersionFiles, Settings, ModelSettings], ServedModel]
    scheduler: Callable[[SchedulerParts], Scheduler]
    # before a pushed version replaces the live one (None: nothing live): ModelLoadError or
    # InvalidInput when it cannot
    check_update: Callable[[ServedModel | None, ServedModel, Canary | None], None]
    default_deadline_ms: Callable[[ModelSettings], float]
    sequences: Callable[[str, ModelSettings], SequenceTable | None]  # server-held memory
    metrics: Callable[[Metrics], Any]  # the kind's sink, made once per Metrics
    frontends: Callable[[FrontendParts], KindRoutes]
    listing: Callable[[list[str], int], dict[str, Any]] | None = None  # GET /v1/models adds
    # a shadow canary's comparison of two versions on a live batch's inputs (None: the kind
    # has none, and refuses a shadow canary)
    compare: Compare | None = None
    openapi: OpenApiPart | None = None  # its own routes, as the OpenAPI document shows them


@cache
def plugin_of(kind: ModelKind) -> KindPlugin:
    """The plug-in of ``kind``, imported by the name its ModelKind member gives."""
    plugin = importlib.import_module(kind.plugin_module).PLUGIN
    if not isinstance(plugin, KindPlugin) or plugin.kind is not kind:
        raise TypeError(f"{kind.plugin_module}.PLUGIN is not the KindPlugin of {kind.name}")
    return plugin


def plugins() -> list[KindPlugin]:
    return [plugin_of(kind) for kind in ModelKind]


def register_metrics(metrics: Metrics) -> None:
    """Every kind's sink and series in the server's metrics (``Metrics.kinds``)."""
    for plugin in plugins():
        metrics.kinds[plugin.kind] = plugin.metrics(metrics)


def kind_of_folder(folder: Path | None) -> ModelKind:
    """The kind a version folder holds (None: a model with no version yet): the kind that
    claims it, else the fallback kind."""
    claims = {plugin.kind: plugin.claims(folder) for plugin in plugins()}
    for wanted in (Claim.YES, Claim.FALLBACK):
        for kind, claim in claims.items():
            if claim is wanted:
                return kind
    raise LookupError(f"no model kind claims {folder} (one kind must be the fallback)")


def plugin_for_contract(contract_kind: str | None) -> KindPlugin:
    """The plug-in that loads model files whose contract is of ``contract_kind``; a file
    with no contract, or of a kind no plug-in loads, goes to the fallback kind, whose loader
    says what is wrong with it."""
    found = next((p for p in plugins() if p.contract_kind == contract_kind), None)
    return found or plugin_of(kind_of_folder(None))
