"""The language-model kind as a plug-in (``ModelKind.GENERATIONS``): a DPO/GRPO-tuned causal
language model (contract kind ``causal-lm``), its tokenizer beside ``model.onnx``.

Its versions are served by the continuous-batching scheduler, answered by its own frontends
(native generate and score, the OpenAI API, and the predict routes, which mean generate for
a language model), and reported through its generation metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from starlette.types import Receive, Scope, Send

from kernel.errors import InvalidInput
from kernel.lm import contract as lm_contract
from serve.batching.plan import buckets_for
from serve.config import ModelSettings, Settings
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.dataplane.scheduler import Scheduler
from serve.frontends.lm import http as lm_http
from serve.frontends.lm import openai_answers, openai_http
from serve.frontends.lm import openapi as lm_openapi
from serve.frontends.lm.calls import LanguageModelCalls
from serve.frontends.predict import http as predict
from serve.lm.metrics import GenerationMetrics
from serve.lm.model import LanguageModel
from serve.lm.scheduling.scheduler import ContinuousBatchScheduler
from serve.plugins import (
    Canary,
    Claim,
    FrontendParts,
    KindPlugin,
    KindRoutes,
    RouteEntry,
    SchedulerParts,
    VersionFiles,
)

log = logging.getLogger("rlserve.repository")


def _claims(folder: Path | None) -> Claim:
    if folder is not None and (folder / lm_contract.TOKENIZER_FILE).is_file():
        return Claim.YES
    return Claim.NO


def _load(files: VersionFiles, settings: Settings, model: ModelSettings) -> ServedModel:
    loaded = LanguageModel.load(
        files.name, files.version, files.path.parent, files.session, files.sha256
    )
    timings = loaded.warm_up(buckets_for(model.max_sequences))
    log.info(
        "loaded %s (language model) on %s in %.2fs (golden prompts OK; one step, ms: %s)",
        f"{files.name}/{files.version}",
        loaded.provider,
        time.monotonic() - files.started,
        ", ".join(f"{size}: {s * 1000:.3g}" for size, s in timings.items()),
    )
    # A language model sits in a model's lifecycle as policy versions do; what the predict
    # path would ask of it, it refuses (serve.lm.model). ServedModel's contract is a
    # policy's: the cast says so until that protocol names both kinds.
    return cast(ServedModel, loaded)


def _scheduler(parts: SchedulerParts) -> Scheduler:
    sink = parts.metrics.kinds[ModelKind.GENERATIONS]
    return ContinuousBatchScheduler(parts.name, parts.versions, parts.settings, sink)


def _check_update(live: ServedModel | None, pushed: ServedModel, canary: Canary | None) -> None:
    """A language model's version was checked by its golden prompts as it loaded."""
    if canary is not None:
        raise InvalidInput(
            "canary: a language model takes no canary observations; its golden prompts "
            "are checked as it loads"
        )


def _frontends(parts: FrontendParts) -> KindRoutes:
    """Generate and score and the OpenAI routes; the predict routes of a language model
    mean generate."""
    calls = LanguageModelCalls(
        parts.router, parts.http_calls, parts.settings.max_body_bytes, turn=parts.turn
    )
    generate = lm_http.LanguageModelFrontend(calls, parts.kind_of)
    openai = openai_http.OpenAIFrontend(calls)

    async def predict_as_generate(
        scope: Scope, receive: Receive, send: Send, path: predict.PredictPath
    ) -> None:
        asked = lm_http.GeneratePath(path.model, path.version, lm_http.Action.GENERATE)
        await generate(scope, receive, send, asked)

    own = [
        RouteEntry(lm_http.PREFIXES, lm_http.match, generate),
        RouteEntry(openai_http.PREFIXES, openai_http.match, openai),
    ]
    return KindRoutes(own, predict_as_generate)


def _listing(models: Iterable[str], created: int) -> dict[str, Any]:
    return openai_answers.model_list(models, created)


PLUGIN = KindPlugin(
    kind=ModelKind.GENERATIONS,
    contract_kind=lm_contract.KIND,
    claims=_claims,
    load=_load,
    scheduler=_scheduler,
    check_update=_check_update,
    default_deadline_ms=lambda settings: settings.generation_deadline_ms,
    sequences=lambda name, settings: None,  # a generation's state lives in its scheduler
    metrics=GenerationMetrics,
    frontends=_frontends,
    listing=_listing,
    openapi=lm_openapi.PART,
)
