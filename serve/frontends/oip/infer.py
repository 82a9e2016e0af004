"""An Open Inference Protocol infer call, whichever transport carried it.

REST (``serve.frontends.oip.rest``) and gRPC (``serve.frontends.oip.rpc``) decode a call into
an :class:`~serve.frontends.oip.signature.InferCall`; :class:`Inference` routes it to the
model's scheduler, the same one the JSON predict routes feed, so rows of every protocol
share batches, deadlines, back-pressure, metrics and drain. The answer comes back as output
tensors for the transport to encode, with the version that computed them. Language
models are not served here (their calls are text): every route that names one is refused
with 422 / INVALID_ARGUMENT, saying where they are served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.errors import InvalidInput, NotFound, RLServeError, quoted
from kernel.json_shown import json_shown
from kernel.versions import path_version
from serve.dataplane.deadline import Deadline, budget_ms
from serve.dataplane.kinds import ModelKind
from serve.dataplane.messages import InferenceResponse
from serve.dataplane.model import RowModel
from serve.dataplane.routing import Route, Router
from serve.dataplane.row_calls import INLINE_BODY_BYTES, RowCalls
from serve.frontends.oip import tensors
from serve.frontends.oip.shared_memory import SharedMemory
from serve.frontends.oip.signature import InferCall, OutputTensor, Signature
from serve.metrics import Metrics
from serve.status import http_status
from serve.stores import features
from serve.stores.features import FeatureLookup


@dataclass(frozen=True, slots=True)
class InferAnswer:
    response: InferenceResponse
    tensors: list[OutputTensor]


ENTITIES = "entities"  # the input a model with a features view may take instead


class Inference:
    """The Open Inference Protocol's own part of an infer call (its routes, signatures and
    refusal count) around the steps every row call takes (:class:`RowCalls`)."""

    def __init__(
        self,
        router: Router,
        metrics: Metrics,
        draining: Callable[[], bool],
        calls: RowCalls,
        shared_memory: SharedMemory,
        features: FeatureLookup,
    ) -> None:
        self.router = router
        self.calls = calls
        self.metrics = metrics
        self.draining = draining
        self.shared_memory = shared_memory  # this process's registered regions
        self.features = features  # models with a features view: their stores
        self._signatures: dict[str, Signature] = {}  # by sha256 of the version

    def route(self, model: str | None, version: str | None, episode: str | None = None) -> Route:
        """Where a call goes (model None: the default model; ``episode``: the episode or
        client key it names, for a canary); a language model is refused: it takes text, not
        tensors."""
        number = None if version is None or version == "" else _version(version)
        route = self.router.resolve(model, number, episode)
        if route.kind is not ModelKind.ROWS:
            raise InvalidInput(
                f"model {route.model!r} is a {route.kind.noun}: the Open Inference Protocol "
                "serves tensor policies only. Generate with POST "
                f"/v1/models/{route.model}/generate (or score with .../score), or with an "
                "OpenAI client at POST /v1/chat/completions and /v1/completions"
            )
        return route

    def signature(self, served: RowModel) -> Signature:
        signature = self._signatures.get(served.sha256)
        if signature is None:
            if len(self._signatures) > 64:  # versions come and go: keep the recent ones
                self._signatures.clear()
            signature = self._signatures[served.sha256] = Signature(served.contract)
        return signature

    async def run(
        self,
        route: Route,
        call: InferCall,
        request_id: str,
        received_at: float,
        deadline: Deadline,
    ) -> InferAnswer:
        """Check, queue and run an admitted call; raises an RLServeError for the transport.
        Inputs in shared memory are read (copied) before anything else; outputs placed there
        are checked to fit before the run and written once it is done."""
        queued = self.queue(route, call, request_id, received_at, deadline)
        if queued is not None:  # no step waits: the batch's future is all there is to await
            future, signature = queued
            return self.answer(call, signature, await future)
        served = route.row_model()
        signature = self.signature(served)
        self._read_placed(call)
        entities = self._entities(call)
        if entities is not None:
            await self._by_entity(route, signature, call, entities, deadline)
            route = route.by_entity()
        request = signature.request(call, request_id, received_at, deadline.at)
        self._check_placed(call, signature)
        size = sum(values.nbytes for values in call.inputs.values())
        prepared = await self.calls.prepare(size, lambda _: served.prepare(request))
        response = await self.calls.submit(route, prepared, deadline)
        return self.answer(call, signature, response)

    def queue(
        self, route: Route, call: InferCall, request_id: str, received_at: float, deadline: Deadline
    ) -> tuple[asyncio.Future[InferenceResponse], Signature] | None:
        """``run``'s steps for a caller that does not await (the HTTP protocol's task-free
        answers), on a call none of whose steps waits: its answer's future, and the
        signature that turns it into tensors (``answer``). None, with nothing done, for a
        call that names entities or whose tensors are too large to check on the loop."""
        size = sum(values.nbytes for values in call.inputs.values())
        size += sum(given.placement.byte_size for given in call.placed)
        if size > INLINE_BODY_BYTES or ENTITIES in call.inputs or ENTITIES in call.parameters:
            return None
        served = route.row_model()
        signature = self.signature(served)
        self._read_placed(call)
        request = signature.request(call, request_id, received_at, deadline.at)
        self._check_placed(call, signature)
        return self.calls.queue(route, served.prepare(request), deadline), signature

    def answer(
        self, call: InferCall, signature: Signature, response: InferenceResponse
    ) -> InferAnswer:
        """The call's output tensors; those placed in shared memory are written there."""
        answer = signature.answer(call, response.outputs)
        for tensor in answer:
            if tensor.placement is not None:
                raw = tensors.to_bytes(tensor.values)
                self.shared_memory.write_output(tensor.name, tensor.placement, raw)
        return InferAnswer(response, answer)

    def _read_placed(self, call: InferCall) -> None:
        for given in call.placed:
            if given.name in call.inputs:
                raise InvalidInput(f"inputs: {quoted(given.name)} is given twice")
            raw = self.shared_memory.read_input(given)
            call.inputs[given.name] = tensors.from_bytes(
                given.name, given.datatype, given.shape, raw
            )

    @staticmethod
    def _entities(call: InferCall) -> list[Any] | None:
        """A call's entity ids: its input ``entities`` (``[-1]``: INT64 ids, or BYTES ids as
        UTF-8 text), or its parameter ``entities`` (a string or integer, or a list of them);
        None: neither."""
        tensor = call.inputs.pop(ENTITIES, None)
        parameter = call.parameters.pop(ENTITIES, None)
        if tensor is not None and parameter is not None:
            raise InvalidInput(f"{ENTITIES}: given as an input and as a parameter; give them once")
        if tensor is not None:
            if tensor.ndim != 1 or not len(tensor) or tensor.dtype.kind not in "iuO":
                raise InvalidInput(
                    f"input {ENTITIES!r}: expected ids of shape [-1] (one per row), INT64 "
                    "numbers or BYTES strings"
                )
            if tensor.dtype.kind != "O":
                ids: list[Any] = tensor.tolist()
                return ids
            return [_text(value, index) for index, value in enumerate(tensor.tolist())]
        if parameter is None:
            return None
        return parameter if isinstance(parameter, list) else [parameter]

    async def _by_entity(
        self,
        route: Route,
        signature: Signature,
        call: InferCall,
        entities: list[Any],
        deadline: Deadline,
    ) -> None:
        """The entities of a call to a model with a features view: their observations from
        the store, as the observation input."""
        view = route.features
        if view is None:
            raise InvalidInput(
                f"input {ENTITIES!r}: model {route.model!r} has no features view (its "
                "config's features), so it reads no store; send its observations"
            )
        names = [meta.name for meta in signature.inputs if signature.field_of(meta.name) is None]
        given = [name for name in names if name in call.inputs]
        if given:
            raise InvalidInput(
                f"inputs: give {ENTITIES!r} or {given[0]!r}: the entities whose features "
                f"model {route.model!r} reads from its store, or the observations themselves"
            )
        rows, _ = await self.features.observations(route.model, view, entities, deadline)
        if not view.parts:
            call.inputs[names[0]] = rows
            return
        parts = features.by_key(view, rows)  # the view's keys are the contract's (at load)
        for name in names:
            call.inputs[name] = parts[str(signature.key_of(name))]

    def _check_placed(self, call: InferCall, signature: Signature) -> None:
        """Before the run: every output placed in shared memory fits where it goes."""
        placed = [output for output in call.chosen or () if output.placement is not None]
        if not placed:
            return
        rows = len(call.inputs[signature.inputs[0].name])
        for output in placed:
            assert output.placement is not None
            needed = signature.output_bytes(output.name, rows)
            self.shared_memory.check_output(output.name, output.placement, needed)

    def admitted(
        self, route: Route, call: InferCall, received_at: float, asked_ms: float | None
    ) -> Deadline:
        """The call's deadline (the model's default, or less as the transport or the call's
        ``timeout`` asks), once admission lets it in (DeadlineExceeded, QueueFull)."""
        budget = call_budget_ms(call, route.default_deadline_ms, asked_ms)
        deadline = self.calls.turn.deadline(received_at, budget)
        self.calls.admit(route, deadline, spent_on="reading it")
        return deadline

    def refused(self, route: Route | None, error: RLServeError, received_at: float) -> None:
        """Count a gRPC call refused with ``error`` in the metrics, as the HTTP routes count
        theirs. ``rlserve_requests_total``'s status is the HTTP status the error's code maps
        to (``serve.status``), whichever transport answered, so that one query or alert
        covers them all; the code itself is the rejection's reason."""
        model, version = ("", None) if route is None else (route.model, route.version.version)
        status, seconds = http_status(error), time.monotonic() - received_at
        self.metrics.refused_error(model, version, status, error, seconds)


def call_budget_ms(call: InferCall, default_ms: float, asked_ms: float | None) -> float:
    """A call's deadline budget (``serve.dataplane.deadline.budget_ms``): the model's
    default, or less when the transport asks for less (``X-Request-Timeout-Ms``, a gRPC
    deadline) or the call's ``timeout`` parameter does."""
    return budget_ms(default_ms, asked_ms, timeout_parameter_ms(call))


def timeout_parameter_ms(call: InferCall) -> float | None:
    """What the call's ``timeout`` parameter asks for (microseconds, as Triton reads it)."""
    timeout_us = call.parameters.get("timeout")
    if timeout_us is None:
        return None
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us <= 0:
        raise InvalidInput(
            "parameters.timeout: expected a positive number of microseconds, got "
            f"{json_shown(timeout_us)}"
        )
    return timeout_us / 1000


def _text(value: bytes, index: int) -> str:
    """A BYTES entity id as the text it names."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise InvalidInput(
            f"input {ENTITIES!r}: element {index} is not UTF-8 text; entity ids are strings "
            "or integers"
        ) from None


def _version(text: str) -> int:
    try:
        return path_version(text)
    except NotFound:
        raise NotFound(
            f"model version {quoted(text)}: a version is a positive integer, like '3'"
        ) from None
