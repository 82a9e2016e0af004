"""Online features: a request names entities, and their observations come from a feature
store (a model's ``features`` view, ``serve.config.FeatureView``).

The predict frontend asks :meth:`FeatureLookup.observations` between decoding a body and
validating it, so the assembled observations are validated like any others:

1. the entity ids are checked (``serve.identifiers``: strings of 1 to 128 characters, or
   integers >= 0; one id, or a list of them for a batch);
2. the store is asked off the event loop. Each store URL has one link: a thread with one
   client that asks for every request's rows queued since its last round trip at once
   (plain Redis: one pipeline of an ``HGETALL`` per entity of a ``hash`` view, an
   ``MGET`` of a ``float32`` view's packed vectors; Feast: one
   ``get_online_features`` call per view, ``serve.dataplane.feast_store``) and converts the
   answer to float rows (NaN where a feature is missing). Under load one round trip
   serves the requests of a batch; no request waits for a connection to open;
3. a missing feature takes the view's default for it, or refuses the request (422, naming
   the entity and the feature); a store that fails or does not answer within the view's
   ``timeout_ms`` (or the request's deadline, if sooner) is a 503 with Retry-After:
   distinct from a 504, as the model was never asked.

A link that failed connects again at once for its next round trip. Metrics: each
request's lookup by result, entity rows, misses by feature (labels bounded to the declared
views), each request's wait for its features, and each store's round trips.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from serve.config import FeatureLayout, FeatureView
from serve.dataplane import feast_store, redis_link
from serve.dataplane.deadline import Deadline
from serve.errors import InvalidInput, ServiceUnavailable
from serve.identifiers import identifier
from serve.json_shown import json_shown
from serve.metrics import Metrics

log = logging.getLogger("rlserve.features")

FIELD = "entities"
OVERRIDES = "features"  # a request's own values of overridable features
RETURN = "return_features"  # the answer carries the feature values used, for audits
WAIT_S = 5.0  # a request waits this long at most for its link's thread (a backstop)
LINK_TIMEOUT_S = 1.0  # a store link's socket timeout, at least
MAX_ENTITIES = 4096  # a request's entities, at most: checked before any is looked at


@dataclass(frozen=True, slots=True)
class EntityRows:
    """The entities of one request, as the store is asked for them."""

    keys: list[str]  # the store's keys, one per row
    ids: list[str | int]  # as the request gave them
    single: bool  # one entity, not a list: the observation has no batch axis


def entity_rows(view: FeatureView, value: Any) -> EntityRows:
    """A request's ``entities``: one id, or a non-empty list of ids."""
    single = not isinstance(value, list)
    given = [value] if single else value
    if not given:
        raise InvalidInput(f"{FIELD}: an empty list; give one entity id or a list of them")
    if len(given) > MAX_ENTITIES:
        raise InvalidInput(
            f"{FIELD}: {len(given):,} entities; a request names {MAX_ENTITIES:,} at most "
            "(send more requests)"
        )
    ids = [
        identifier(one, FIELD if single else f"{FIELD}[{index}]", "an entity id")
        for index, one in enumerate(given)
    ]
    return EntityRows([f"{view.prefix}{i}" for i in ids], ids, single)


def overridden(view: FeatureView, rows: np.ndarray, given: Any) -> np.ndarray:
    """``rows`` with a request's own ``features`` over the stored ones: one mapping of
    feature to value for every row, or a list of mappings, one per row; only the view's
    ``overridable`` features."""
    mappings = given if isinstance(given, list) else [given] * len(rows)
    if len(mappings) != len(rows) or not all(isinstance(m, dict) for m in mappings):
        raise InvalidInput(
            f"{OVERRIDES}: expected an object of feature to value (for every row), or a list "
            f"of {len(rows)} such objects, one per entity"
        )
    columns = {name: index for index, name in enumerate(view.columns)}
    for row, mapping in enumerate(mappings):
        for name, value in mapping.items():
            if name not in view.overridable:
                allowed = view.overridable or "none"
                raise InvalidInput(
                    f"{OVERRIDES}: {name!r} may not be given by a request; the view lets a "
                    f"request give {allowed}"
                )
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value):
                raise InvalidInput(
                    f"{OVERRIDES}.{name}: expected a finite number, got {json_shown(value)}"
                )
            rows[row, columns[name]] = value
    return rows


def used(view: FeatureView, rows: np.ndarray, *, single: bool) -> dict[str, Any]:
    """The feature values a request's observations were made of, by feature (audits)."""
    return {
        name: (float(rows[0, column]) if single else rows[:, column].tolist())
        for column, name in enumerate(view.columns)
    }


def observations(view: FeatureView, rows: np.ndarray, *, single: bool) -> Any:
    """The predict routes' ``observations`` of a request's rows: the rows (one of them
    without a batch axis when the request named one entity), or for a Dict view an object
    of each observation key's columns."""
    if not view.parts:
        return rows[0] if single else rows
    return {key: part[0] if single else part for key, part in by_key(view, rows).items()}


def by_key(view: FeatureView, rows: np.ndarray) -> dict[str, np.ndarray]:
    """A Dict view's rows as each observation key's columns, [entities, its features]."""
    parts, start = {}, 0
    for key, names in view.parts:
        parts[key] = np.ascontiguousarray(rows[:, start : start + len(names)])
        start += len(names)
    return parts


class FeatureLookup:
    """Every model's feature lookups of this process, one link per store URL."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._links: dict[tuple[str, float], _Link] = {}

    async def observations(
        self,
        model: str,
        view: FeatureView,
        entities: Any,
        deadline: Deadline,
        overrides: Any = None,
    ) -> tuple[np.ndarray, bool]:
        """The observations of a request's ``entities`` (float32 rows in the view's feature
        order; a request's own ``overrides`` over stored values, defaults for missing ones),
        and whether it named one entity (no batch axis)."""
        rows = entity_rows(view, entities)
        started = time.monotonic()
        wait_s = min(view.timeout_ms / 1000, deadline.at - started)
        if wait_s <= 0:
            deadline.check("waiting to ask the feature store")
        values = await self._link(view).ask(_Asked(rows, view), wait_s)
        self._metrics.child(self._metrics.feature_lookup_seconds, model).observe(
            time.monotonic() - started
        )
        if values is None:
            self._metrics.child(self._metrics.feature_lookups, model, "error").inc()
            raise ServiceUnavailable(
                f"model {model!r}: the feature store {redis_link.shown(view.store)} did not "
                f"answer within {wait_s * 1000:.3g} ms (the view's timeout_ms, or the "
                "request's deadline); retry shortly, or send observations",
                retry_after_s=1,
            )
        self._metrics.child(self._metrics.feature_lookups, model, "ok").inc()
        self._metrics.child(self._metrics.feature_rows, model).inc(len(rows.keys))
        if overrides is not None:
            values = overridden(view, values, overrides)
        return self._filled(model, view, rows, values), rows.single

    def _filled(
        self, model: str, view: FeatureView, rows: EntityRows, values: np.ndarray
    ) -> np.ndarray:
        """Missing features from the view's defaults, or a refusal naming the first."""
        missing = np.isnan(values)
        if not missing.any():
            return values
        for column, feature in enumerate(view.columns):
            count = int(missing[:, column].sum())
            if not count:
                continue
            self._metrics.child(self._metrics.feature_misses, model, feature).inc(count)
            default = view.defaults.get(feature)
            if default is None:
                row = int(np.argmax(missing[:, column]))
                key = "" if view.feast else f" (key {rows.keys[row]!r})"
                raise InvalidInput(
                    f"{FIELD}{'' if rows.single else f'[{row}]'}: the feature store holds no "
                    f"{feature!r} for entity {json_shown(rows.ids[row])}{key}, and the view "
                    "gives it no default; store it, or send the observation itself"
                )
            values[missing[:, column], column] = default
        return values

    def _link(self, view: FeatureView) -> _Link:
        key = (view.store, view.timeout_ms)
        link = self._links.get(key)
        if link is None:
            counted = self._metrics.child(
                self._metrics.feature_round_trips, redis_link.shown(view.store)
            )
            store = view.store
            # The link's socket waits longer than a request does: each request gives up at
            # its own timeout (a 503), and a round trip serving many is not failed whole
            # (and its connection dropped) for one slow read.
            timeout_s = max(view.timeout_ms / 1000, LINK_TIMEOUT_S)
            opener: Callable[[], _Store] = (
                (lambda: _Feast(store)) if view.feast else (lambda: _PlainRedis(store, timeout_s))
            )
            link = self._links[key] = _Link(store, opener, counted)
        return link

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()


@dataclass(frozen=True, slots=True)
class _Asked:
    """One request's rows, and the view that says what to read for them."""

    rows: EntityRows
    view: FeatureView


class _Store(Protocol):
    def round_trip(self, asked: list[_Asked]) -> list[np.ndarray]:
        """Each request's float rows [entities, features], NaN where missing."""
        ...

    def close(self) -> None: ...


class _PlainRedis:
    """Plain Redis, one pipeline for a round trip: an ``HGETALL`` per entity of a ``hash``
    view, and one ``MGET`` of every entity of a ``float32`` view. (``HGETALL`` and a lookup
    by name here: an ``HMGET`` naming every feature took about five times as long for a
    376-feature observation. Its answer is taken as the flat list the parser gives, not as
    redis-py's dict: the fields are picked in C, ``operator.itemgetter``.)"""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = redis_link.client(url, timeout_s)
        self.client.set_response_callback("HGETALL", _flat)
        self._pickers: dict[tuple[str, ...], _Picker] = {}

    def round_trip(self, asked: list[_Asked]) -> list[np.ndarray]:
        pipe = self.client.pipeline(transaction=False)
        for one in asked:
            if one.view.layout is FeatureLayout.FLOAT32:
                pipe.mget(one.rows.keys)
            else:
                for key in one.rows.keys:
                    pipe.hgetall(key)
        answers = iter(pipe.execute())
        found = []
        for one in asked:
            width = len(one.view.columns)
            if one.view.layout is FeatureLayout.FLOAT32:
                found.append(_packed(next(answers), width))
                continue
            picker = self._picker(one.view.columns)
            values = [picker.values(next(answers)) for _ in one.rows.keys]
            found.append(_floats(values, width))
        return found

    def _picker(self, features: list[str]) -> _Picker:
        key = tuple(features)
        picker = self._pickers.get(key)
        if picker is None:
            picker = self._pickers[key] = _Picker(features)
        return picker

    def close(self) -> None:
        redis_link.close(self.client)


class _Picker:
    """A ``hash`` view's features out of one entity's ``HGETALL`` answer, in order."""

    def __init__(self, features: list[str]) -> None:
        self.names = [feature.encode() for feature in features]
        self._all = operator.itemgetter(*self.names)

    def values(self, pairs: list[bytes]) -> list[bytes | None]:
        """The stored values, None where a feature is missing."""
        fields = iter(pairs)
        stored = dict(zip(fields, fields, strict=False))
        try:
            picked = self._all(stored)
        except KeyError:  # a missing feature: each on its own
            return [stored.get(name) for name in self.names]
        return list(picked) if isinstance(picked, tuple) else [picked]


class _Feast:
    """A Feast feature repository through its SDK: one ``get_online_features`` call for
    every queued request of a view, entity rows side by side."""

    def __init__(self, url: str) -> None:
        self.store = feast_store.opened(url)

    def round_trip(self, asked: list[_Asked]) -> list[np.ndarray]:
        found: list[np.ndarray] = [np.empty(0)] * len(asked)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for index, one in enumerate(asked):
            groups.setdefault((one.view.entity, tuple(one.view.columns)), []).append(index)
        for (entity, features), members in groups.items():
            ids = [i for m in members for i in asked[m].rows.ids]
            answer = self.store.get_online_features(
                features=list(features), entity_rows=[{entity: i} for i in ids]
            ).to_dict()
            columns = [answer[feature.split(":", 1)[1]] for feature in features]
            rows = np.array(
                [
                    [math.nan if c[r] is None else _number(c[r]) for c in columns]
                    for r in range(len(ids))
                ],
                np.float32,
            ).reshape(len(ids), len(features))
            start = 0
            for m in members:
                count = len(asked[m].rows.ids)
                found[m] = rows[start : start + count]
                start += count
        return found

    def close(self) -> None:
        pass


_Queued = tuple[_Asked, "asyncio.Future[np.ndarray | None]", asyncio.AbstractEventLoop]


class _Link:
    """One store's thread and client: what is asked, a round trip at a time."""

    def __init__(self, url: str, opener: Callable[[], _Store], round_trips: Any) -> None:
        self.url = url
        self._opener = opener
        self._round_trips = round_trips  # the counter of this store's round trips
        self._asked: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"features-{redis_link.shown(url)}", daemon=True
        )
        self._thread.start()

    async def ask(self, asked: _Asked, wait_s: float) -> np.ndarray | None:
        """Float rows [entities, features], NaN where missing; None: the store failed or
        did not answer within ``wait_s``."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[np.ndarray | None] = loop.create_future()
        self._asked.put((asked, answered, loop))
        try:
            return await asyncio.wait_for(answered, min(wait_s, WAIT_S))
        except TimeoutError:
            return None

    def _run(self) -> None:
        store: _Store | None = None
        while True:
            batch: list[_Queued] | None = redis_link.take(self._asked)
            if batch is None:
                break
            found: list[np.ndarray | None]
            try:
                if store is None:
                    store = self._opener()
                self._round_trips.inc()
                found = list(store.round_trip([asked for asked, _, _ in batch]))
            except Exception as exc:  # the store's client raises its own types, and OSError
                log.warning("feature store %s: %r", redis_link.shown(self.url), exc)
                if store is not None:
                    store.close()
                store = None
                found = [None] * len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
            for (_, answered, loop), values in zip(batch, found, strict=True):
                by_loop.setdefault(loop, []).append((answered, values))
            for loop, settled in by_loop.items():  # one wake-up of each loop per round trip
                loop.call_soon_threadsafe(_settle, settled)
        if store is not None:
            store.close()

    def close(self) -> None:
        self._asked.put(redis_link.STOP)
        self._thread.join(redis_link.CONNECT_S + 1)


def _packed(values: list[bytes | None], width: int) -> np.ndarray:
    """``float32`` views' values: ``width`` little-endian float32 each, NaN rows where a key
    is missing or holds another number of bytes."""
    rows = np.full((len(values), width), np.nan, np.float32)
    for row, value in enumerate(values):
        if value is not None and len(value) == 4 * width:
            rows[row] = np.frombuffer(value, "<f4")
    rows[~np.isfinite(rows)] = np.nan
    return rows


def _flat(answer: Any) -> Any:
    """An ``HGETALL`` answer as the parser gave it: field, value, field, value..."""
    return answer


def _floats(rows: list[list[Any]], width: int) -> np.ndarray:
    """Stored values (bytes, or None where missing) as float32 rows, NaN where missing or
    not a finite number (``float`` parses text faster than numpy's cast from bytes)."""
    flat = [b"nan" if value is None else value for row in rows for value in row]
    try:
        numbers = list(map(float, flat))
    except ValueError:  # a value that is no number: each on its own
        numbers = [_number(value) for value in flat]
    values = np.array(numbers, np.float32)
    values[~np.isfinite(values)] = np.nan
    return values.reshape(len(rows), width)


def _number(value: Any) -> float:
    """A stored feature's value; NaN (missing) when it is not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def _settle(settled: list[tuple[asyncio.Future[np.ndarray | None], np.ndarray | None]]) -> None:
    for answered, values in settled:
        if not answered.done():
            answered.set_result(values)
