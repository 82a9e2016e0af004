"""Online features: a request names entities, and their observations come from a feature
store (a model's ``features`` view, ``serve.config.FeatureView``).

The predict frontend asks :meth:`FeatureLookup.observations` between decoding a body and
validating it, so the assembled observations are validated like any others:

1. the entity ids are checked (``kernel.identifiers``: strings of 1 to 128 characters, or
   integers >= 0; one id, or a list of them for a batch);
2. the store is asked off the event loop. Each store URL has one link: a thread with one
   client that asks for every request's rows queued since its last round trip at once
   (plain Redis: one pipeline of an ``HGETALL`` per entity of a ``hash`` view, an
   ``MGET`` of a ``float32`` view's packed vectors; Feast: one
   ``get_online_features`` call per view, ``serve.stores.feast_store``) and converts the
   answer to float rows (NaN where a feature is missing). Under load one round trip
   serves the requests of a batch; no request waits for a connection to open;
3. what one entity's key holds is that request's alone: a key of another type (a string
   where a hash should be), a value that is no number (stored text is read as JSON number
   syntax, nothing looser: ``1_0``, `` 1``, ``0x10`` are refused) or a packed vector of
   another length refuses the request that named the entity (422, naming it, its key and
   what was found), and the round trip's other requests are served;
4. a missing feature (or one stored as NaN or an infinity) takes the view's default for
   it, or refuses the request (422, naming the entity and the feature); a store that fails
   (its error quoted: connection refused, a timeout) or does not answer within the view's
   ``timeout_ms`` (or the request's deadline, if sooner) is a 503 with Retry-After:
   distinct from a 504, as the model was never asked.

A link that failed connects again at once for its next round trip. Metrics: each
request's lookup by result, entity rows, misses by feature (labels bounded to the declared
views), each request's wait for its features, and each store's round trips.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import operator
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kernel.errors import InvalidInput, ServiceUnavailable, one_line, quoted
from kernel.identifiers import identifier
from kernel.json_shown import json_shown
from serve.config import FeatureLayout, FeatureView
from serve.dataplane.deadline import Deadline
from serve.metrics import Metrics
from serve.stores import feast_store, redis_link

log = logging.getLogger("rlserve.features")

FIELD = "entities"
OVERRIDES = "features"  # a request's own values of overridable features
RETURN = "return_features"  # the answer carries the feature values used, for audits
WAIT_S = 5.0  # a request waits this long at most for its link's thread (a backstop)
LINK_TIMEOUT_S = 1.0  # a store link's socket timeout, at least
MAX_ENTITIES = 4096  # a request's entities, at most: checked before any is looked at

# A stored feature's text: a JSON number, or NaN or an infinity as Python and numpy write
# them (read as missing, as a NaN stored packed is). Nothing looser that ``float`` takes:
# no underscores, whitespace, leading "+", ".5" or "1.".
_NUMBER = re.compile(
    rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
    rb"|[+-]?(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
)
_NUMERIC = b"0123456789.eE+-,"  # the only bytes of JSON numbers joined by commas


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
        found = await self._link(view).ask(_Asked(rows, view), wait_s)
        self._metrics.child(self._metrics.feature_lookup_seconds, model).observe(
            time.monotonic() - started
        )
        if found is None or isinstance(found, _Failed):
            self._metrics.child(self._metrics.feature_lookups, model, "error").inc()
            what = (
                f"did not answer within {_ms(wait_s)} (the view's timeout_ms, or the "
                "request's deadline)"
                if found is None
                else f"failed: {found.reason}"
            )
            raise ServiceUnavailable(
                f"model {model!r}: the feature store {redis_link.shown(view.store)} {what}; "
                "retry shortly, or send observations",
                retry_after_s=1,
            )
        self._metrics.child(self._metrics.feature_lookups, model, "ok").inc()
        if isinstance(found, InvalidInput):  # what this request's entities hold
            raise found
        values = found
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
                raise InvalidInput(
                    f"{_where(rows, row)}: the feature store holds no {feature!r} "
                    f"{_entity(view, rows, row)}, and the view gives it no default; store it, "
                    "or send the observation itself"
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


@dataclass(frozen=True, slots=True)
class _Failed:
    """The store failed a request's round trip (or its command): what it said."""

    reason: str


# A request's answer from its link: its float rows [entities, features] (NaN where
# missing), the refusal of what one of its entities holds (422), or the store's failure.
_Found = np.ndarray | InvalidInput | _Failed


class _Store(Protocol):
    def round_trip(self, asked: list[_Asked]) -> list[_Found]:
        """Each request's answer, in order: one request's bad entity is its own."""
        ...

    def close(self) -> None: ...


class _PlainRedis:
    """Plain Redis, one pipeline for a round trip: an ``HGETALL`` per entity of a ``hash``
    view, and one ``MGET`` of every entity of a ``float32`` view. (``HGETALL`` and a lookup
    by name here: an ``HMGET`` naming every feature took about five times as long for a
    376-feature observation. Its answer is taken as the flat list the parser gives, not as
    redis-py's dict: the fields are picked in C, ``operator.itemgetter``.)

    The pipeline's commands answer each on its own (an error in place of its answer): a
    key of another type (``WRONGTYPE``) is its request's refusal, and only then is the
    store asked, in a second pipeline, what those keys hold (``TYPE``), for the message."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = redis_link.client(url, timeout_s)
        self.client.set_response_callback("HGETALL", _flat)
        self._pickers: dict[tuple[str, ...], _Picker] = {}

    def round_trip(self, asked: list[_Asked]) -> list[_Found]:
        pipe = self.client.pipeline(transaction=False)
        hashes: list[str | None] = []  # each command's hash key (None: an MGET)
        for one in asked:
            if one.view.layout is FeatureLayout.FLOAT32:
                pipe.mget(one.rows.keys)
                hashes.append(None)
            else:
                for key in one.rows.keys:
                    pipe.hgetall(key)
                hashes.extend(one.rows.keys)
        answered = pipe.execute(raise_on_error=False)
        wrong = [k for k, a in zip(hashes, answered, strict=True) if k is not None and _wrong(a)]
        kinds = self._kinds(wrong)
        answers = iter(answered)
        found: list[_Found] = []
        for one in asked:
            count = 1 if one.view.layout is FeatureLayout.FLOAT32 else len(one.rows.keys)
            found.append(self._found(one, [next(answers) for _ in range(count)], kinds))
        return found

    def _found(self, one: _Asked, answers: list[Any], kinds: dict[str, str]) -> _Found:
        """One request's rows, or what keeps them from being read."""
        for row, answer in enumerate(answers):
            if not isinstance(answer, Exception):
                continue
            if not _wrong(answer):  # an error the store gave for this command (ACLs)
                return _failed(answer)
            kind = kinds.get(one.rows.keys[row], "a value of another type")
            return InvalidInput(
                f"{_where(one.rows, row)}: the feature store holds {kind}, not a hash, "
                f"{_entity(one.view, one.rows, row)}; the view's layout is hash (one field per "
                "feature): store the entity's features with HSET, or read packed vectors with "
                "layout: float32"
            )
        try:
            if one.view.layout is FeatureLayout.FLOAT32:
                return _packed(one, answers[0])
            picker = self._picker(one.view.columns)
            return _floats(one, [picker.values(answer) for answer in answers])
        except InvalidInput as refused:
            return refused

    def _kinds(self, keys: list[str]) -> dict[str, str]:
        """What each key of another type than a hash holds, as a message says it."""
        if not keys:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        kinds = pipe.execute(raise_on_error=False)
        return {key: _kind(kind) for key, kind in zip(keys, kinds, strict=True)}

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

    def round_trip(self, asked: list[_Asked]) -> list[_Found]:
        found: list[_Found] = [np.empty(0)] * len(asked)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for index, one in enumerate(asked):
            groups.setdefault((one.view.entity, tuple(one.view.columns)), []).append(index)
        for (entity, features), members in groups.items():
            ids = [i for m in members for i in asked[m].rows.ids]
            answer = self.store.get_online_features(
                features=list(features), entity_rows=[{entity: i} for i in ids]
            ).to_dict()
            columns = [answer[feature.split(":", 1)[1]] for feature in features]
            start = 0
            for m in members:
                count = len(asked[m].rows.ids)
                rows = [[c[r] for c in columns] for r in range(start, start + count)]
                try:
                    found[m] = _floats(asked[m], rows)
                except InvalidInput as refused:
                    found[m] = refused
                start += count
        return found

    def close(self) -> None:
        pass


_Queued = tuple[_Asked, "asyncio.Future[_Found | None]", asyncio.AbstractEventLoop]


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

    async def ask(self, asked: _Asked, wait_s: float) -> _Found | None:
        """The request's answer (its rows, its refusal or the store's failure); None: the
        store did not answer within ``wait_s``."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[_Found | None] = loop.create_future()
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
            found: list[_Found]
            try:
                if store is None:
                    store = self._opener()
                self._round_trips.inc()
                found = store.round_trip([asked for asked, _, _ in batch])
            except Exception as exc:  # the store's client raises its own types, and OSError
                log.warning("feature store %s: %r", redis_link.shown(self.url), exc)
                if store is not None:
                    store.close()
                store = None
                found = [_failed(exc)] * len(batch)
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


def _where(rows: EntityRows, row: int) -> str:
    """The request's field that named the entity of ``row``."""
    return FIELD if rows.single else f"{FIELD}[{row}]"


def _entity(view: FeatureView, rows: EntityRows, row: int) -> str:
    """The entity of ``row`` for a message: its id, and its key (plain Redis)."""
    key = "" if view.feast else f" (key {rows.keys[row]!r})"
    return f"for entity {json_shown(rows.ids[row])}{key}"


def _failed(exc: Exception) -> _Failed:
    """The store's error as a message quotes it (``ConnectionError: ... refused.``)."""
    return _Failed(f"{type(exc).__name__}: {one_line(exc)}")


def _wrong(answer: Any) -> bool:
    """The command's answer is Redis's error for a key of another type."""
    return isinstance(answer, Exception) and str(answer).startswith("WRONGTYPE")


_KINDS = {
    "string": "a string",
    "list": "a list",
    "set": "a set",
    "zset": "a sorted set",
    "stream": "a stream",
}


def _kind(kind: Any) -> str:
    """A ``TYPE`` answer as a message names it (``a string``)."""
    if isinstance(kind, Exception):
        return "a value of another type"
    name = kind.decode(errors="replace") if isinstance(kind, bytes) else str(kind)
    if name == "none":
        return "a value of another type (deleted since)"
    return _KINDS.get(name, f"a value of type {quoted(name)}")


def _packed(one: _Asked, values: list[bytes | None]) -> np.ndarray:
    """``float32`` views' values: the view's width of little-endian float32 each, NaN rows
    where a key is missing (or holds no string: MGET answers nothing then); a value of
    another length refuses the request."""
    width = len(one.view.columns)
    rows = np.full((len(values), width), np.nan, np.float32)
    for row, value in enumerate(values):
        if value is None:
            continue
        if len(value) != 4 * width:
            raise InvalidInput(
                f"{_where(one.rows, row)}: the feature store holds {len(value):,} bytes "
                f"{_entity(one.view, one.rows, row)}, not the view's {width} float32 values "
                f"({4 * width} bytes, little-endian: layout float32); store the entity's "
                "packed vector"
            )
        rows[row] = np.frombuffer(value, "<f4")
    rows[~np.isfinite(rows)] = np.nan
    return rows


def _flat(answer: Any) -> Any:
    """An ``HGETALL`` answer as the parser gave it: field, value, field, value..."""
    return answer


def _floats(one: _Asked, rows: list[list[Any]]) -> np.ndarray:
    """A request's stored values (text as bytes; None where missing; Feast's typed values)
    as float32 rows [entities, features], NaN where missing or not finite; a value that is
    no number refuses the request, naming the entity, the feature and the value."""
    flat = [value for row in rows for value in row]
    numbers = _json_numbers(flat)
    if numbers is None:  # missing values, non-finite ones, typed ones, or no number
        numbers = np.array([_checked(one, i, value) for i, value in enumerate(flat)], np.float64)
    with np.errstate(over="ignore"):  # a finite number past float32's range: missing
        values = numbers.astype(np.float32)
    values[~np.isfinite(values)] = np.nan
    return values.reshape(len(rows), len(one.view.columns))


def _json_numbers(values: list[Any]) -> np.ndarray | None:
    """The numbers of ``values`` when every one is the bytes of a JSON number (the usual
    case: checked and parsed in C, as a JSON array of them), else None."""
    try:
        joined = b",".join(values)
    except TypeError:  # a missing value (None), or one of Feast's typed values
        return None
    if joined.translate(None, _NUMERIC):  # a byte no JSON number has ("_", " ", "x")
        return None
    try:
        numbers = np.array(json.loads(b"[" + joined + b"]"), np.float64)
    except (ValueError, OverflowError):  # no JSON number ("+1", ".5"), or a huge integer
        return None
    return numbers if len(numbers) == len(values) else None  # a value held a comma


def _checked(one: _Asked, index: int, value: Any) -> float:
    """The ``index``-th value of a request's rows on its own, or its refusal."""
    try:
        return _number(value)
    except (TypeError, ValueError, OverflowError):
        row, column = divmod(index, len(one.view.columns))
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        shown = quoted(text) if isinstance(text, str) else quoted(repr(value))
        raise InvalidInput(
            f"{_where(one.rows, row)}: the feature store holds {one.view.columns[column]!r} "
            f"= {shown} {_entity(one.view, one.rows, row)}, which is not a number; store it "
            "as a JSON number (such as -0.25 or 1e-3)"
        ) from None


def _number(value: Any) -> float:
    """A stored feature's value: text in JSON number syntax (ValueError for anything
    looser), or a typed number (Feast's); NaN where missing (None) or not finite."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes) and _NUMBER.fullmatch(value) is None:
        raise ValueError(f"not a JSON number: {value!r}")
    number = float(value)
    return number if math.isfinite(number) else math.nan


def _ms(seconds: float) -> str:
    """A wait in milliseconds for a message: ``1,000 ms``, ``2.5 ms``, ``0.25 ms``."""
    ms = seconds * 1000
    return f"{ms:,.1f}".removesuffix(".0") + " ms" if ms >= 1 else f"{ms:.2g} ms"


def _settle(settled: list[tuple[asyncio.Future[_Found | None], _Found | None]]) -> None:
    for answered, values in settled:
        if not answered.done():
            answered.set_result(values)
