"""The feature lookup's rules: entity ids, overrides, stored text (JSON numbers only) and
packed values as float rows, a Dict view's rows by key, and a view checked against a
version's observation space; against a real ``redis-server``, what one entity's key holds
answering only the request that named it, and a store's failures told as they happened."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from kernel.contract import PolicyContract
from kernel.errors import ContractError, InvalidInput, ServiceUnavailable
from kernel.spaces import Box, Dict, Discrete
from serve.config import FeatureView
from serve.dataplane.deadline import Deadline
from serve.metrics import Metrics
from serve.policy.loading import check_view
from serve.stores import features
from tests.e2e.server import free_port
from tests.redis_server import RedisServer, running_redis

STORE = "redis://127.0.0.1:6379/0"
FLAT = FeatureView.model_validate({"store": STORE, "entity": "cart", "features": ["x", "v", "t"]})
PACKED = FeatureView.model_validate(
    {**FLAT.model_dump(), "layout": "float32", "key_prefix": "vec:"}
)
KEYED = FeatureView.model_validate(
    {
        "store": STORE,
        "entity": "robot",
        "features": {"body": ["bx", "by", "bz"], "goal": ["gx", "gy"]},
        "overridable": ["gy"],
    }
)


def test_entities_are_one_id_or_a_list_of_them() -> None:
    one = features.entity_rows(FLAT, 42)
    assert (one.keys, one.ids, one.single) == (["cart:42"], [42], True)
    many = features.entity_rows(FLAT, ["a", 7])
    assert (many.keys, many.single) == (["cart:a", "cart:7"], False)
    with pytest.raises(InvalidInput, match="an empty list"):
        features.entity_rows(FLAT, [])
    with pytest.raises(InvalidInput, match=r"entities\[1\]: expected an entity id"):
        features.entity_rows(FLAT, ["a", -1])
    with pytest.raises(InvalidInput, match="4,097 entities; a request names 4,096 at most"):
        features.entity_rows(FLAT, list(range(features.MAX_ENTITIES + 1)))


def asked(view: FeatureView, entities: Any) -> features._Asked:
    return features._Asked(features.entity_rows(view, entities), view)


def test_stored_text_becomes_float_rows_with_nan_where_missing_or_not_finite() -> None:
    rows: list[list[Any]] = [[b"0.5", None, b"-2"], [b"inf", b"NaN", b"1e-3"]]
    values = features._floats(asked(FLAT, [1, 2]), rows)
    assert values.dtype == np.float32
    expected = np.array([[0.5, np.nan, -2.0], [np.nan, np.nan, 1e-3]], np.float32)
    np.testing.assert_array_equal(values, expected)


@pytest.mark.parametrize(
    "text",
    [b"0", b"-0", b"7", b"-12.5", b"1e3", b"1E+2", b"2.5e-3", b"1e999", b"1" * 400, b"1e-400"],
)
def test_json_numbers_are_read_as_float_reads_them(text: bytes) -> None:
    """The fast path (every value a JSON number, parsed as one JSON array) and the value
    on its own (with a missing value beside it) read the same; past float32's range is
    missing (NaN)."""
    expected = np.float32(float(text)) if abs(float(text)) < 3.4e38 else np.float32("nan")
    fast = features._floats(asked(FLAT, 1), [[text, b"0", b"0"]])
    alone = features._floats(asked(FLAT, 1), [[text, None, b"0"]])
    np.testing.assert_array_equal(fast[0, 0], expected)
    np.testing.assert_array_equal(alone[0, 0], expected)


@pytest.mark.parametrize(
    "text",
    [
        *(b"1_0", b" 1", b"1 ", b"0x10", b"+1", b".5", b"1.", b"01", b"1e", b"--1", b"1,2"),
        *(b"", b"ten", b"\xd9\xa1", b"nan ", b"infinite"),  # "\xd9\xa1": an Arabic-Indic one
    ],
)
def test_a_value_that_is_no_json_number_refuses_its_request_naming_it(text: bytes) -> None:
    """What ``float`` takes and JSON does not (``1_0`` read as 10.0 before) is no number:
    the request is refused, naming the entity, its key, the feature and the value."""
    shown = repr(text.decode(errors="replace"))
    for row in ([b"0", b"0", b"0"], [b"0", None, b"0"]):  # the fast path, and one by one
        with pytest.raises(InvalidInput) as refused:
            features._floats(asked(FLAT, [3, 7]), [row, [b"0", text, b"0"]])
        assert refused.value.message.startswith(
            f"entities[1]: the feature store holds 'v' = {shown} for entity 7 (key 'cart:7'), "
            "which is not a number; store it as a JSON number"
        )


def test_a_hash_answer_is_picked_in_the_views_order() -> None:
    picker = features._Picker(["x", "v", "t"])
    assert picker.values([b"t", b"3", b"x", b"1", b"v", b"2", b"extra", b"9"]) == [
        b"1",
        b"2",
        b"3",
    ]
    assert picker.values([b"t", b"3"]) == [None, None, b"3"]  # missing: each on its own
    assert features._Picker(["x"]).values([b"x", b"1"]) == [b"1"]  # one feature


def test_packed_vectors_are_rows_and_one_of_another_length_refuses_its_request() -> None:
    good = np.array([1.0, 2.0, np.inf], "<f4").tobytes()
    values = features._packed(asked(PACKED, [1, 2]), [good, None])
    np.testing.assert_array_equal(values[0], [1.0, 2.0, np.nan])  # not finite: missing
    assert np.isnan(values[1]).all()  # no key: missing
    with pytest.raises(InvalidInput) as refused:
        features._packed(asked(PACKED, [1, 2]), [good, good[:8]])
    assert refused.value.message.startswith(
        "entities[1]: the feature store holds 8 bytes for entity 2 (key 'vec:2'), not the "
        "view's 3 float32 values (12 bytes, little-endian: layout float32)"
    )


def test_overrides_replace_overridable_features_only() -> None:
    rows = np.zeros((2, 5), np.float32)
    features.overridden(KEYED, rows, [{"gy": 1.5}, {}])
    assert rows[0, 4] == 1.5
    assert rows[1, 4] == 0
    with pytest.raises(InvalidInput, match="'bx' may not be given by a request"):
        features.overridden(KEYED, rows, {"bx": 1.0})
    with pytest.raises(InvalidInput, match="expected a finite number"):
        features.overridden(KEYED, rows, {"gy": "1"})
    with pytest.raises(InvalidInput, match="a list of 2 such objects"):
        features.overridden(KEYED, rows, [{}])


def test_a_dict_views_rows_are_split_by_observation_key() -> None:
    rows = np.arange(10, dtype=np.float32).reshape(2, 5)
    many = features.observations(KEYED, rows, single=False)
    np.testing.assert_array_equal(many["body"], [[0, 1, 2], [5, 6, 7]])
    np.testing.assert_array_equal(many["goal"], [[3, 4], [8, 9]])
    one = features.observations(KEYED, rows[:1], single=True)
    np.testing.assert_array_equal(one["goal"], [3, 4])
    flat = features.observations(FLAT, rows[:, :3], single=True)
    np.testing.assert_array_equal(flat, [0, 1, 2])
    assert features.used(KEYED, rows, single=False)["gx"] == [3.0, 8.0]


def contract(space: Any) -> PolicyContract:
    return PolicyContract.model_construct(observation_space=space)


VECTORS = Dict(spaces={"body": Box(shape=(3,)), "goal": Box(shape=(2,))})


@pytest.mark.parametrize(
    ("view", "space", "message"),
    [
        (FLAT, Box(shape=(3,)), None),
        (KEYED, VECTORS, None),
        (FLAT, Box(shape=(4,)), "lists 3 features .* observation has 4 values"),
        (FLAT, Box(shape=(3,), dtype="uint8"), "a 1-D float Box"),
        (FLAT, VECTORS, "builds a flat float observation"),
        (KEYED, Box(shape=(5,)), r"lists features by observation key \(\['body', 'goal'\]\)"),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "aim": Box(shape=(2,))}),
            r"keys \['body', 'goal'\], but this version's Dict space has \['aim', 'body'\]",
        ),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "goal": Box(shape=(3,))}),
            "lists 2 features for 'goal' .* observation 'goal' has 3 values",
        ),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "goal": Discrete(n=2)}),
            "a flat float observation 'goal'",
        ),
    ],
)
def test_a_view_is_checked_against_the_observation_space(
    view: FeatureView, space: Any, message: str | None
) -> None:
    if message is None:
        check_view(view, contract(space), "m/1")
        return
    with pytest.raises(ContractError, match=message):
        check_view(view, contract(space), "m/1")


# ------------------------------------------------- against a real redis-server


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("features-redis"), persistent=False) as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def viewed(store: RedisServer, view: FeatureView, **changed: Any) -> FeatureView:
    """``view`` reading from ``store`` (db 3), with ``changed`` fields."""
    fields = {**view.model_dump(), "store": store.address(3), "timeout_ms": 3000, **changed}
    return FeatureView.model_validate(fields)


def held(store: RedisServer) -> None:
    """Entity 1 and 2 as hashes, 9 a string, 5 a list, 8 with x stored as 1_0; vec:1 a
    packed vector."""
    with redis.Redis.from_url(store.address(3)) as client:
        client.flushdb()
        client.hset("cart:1", mapping={"x": "0.5", "v": "-1", "t": "2e-1"})
        client.hset("cart:2", mapping={"x": "1", "v": "0", "t": "-0.25"})
        client.set("cart:9", "x")
        client.rpush("cart:5", "x")
        client.hset("cart:8", mapping={"x": "1_0", "v": "0", "t": "0"})
        client.set("vec:1", np.array([1.0, 2.0, 3.0], "<f4").tobytes())


def deadline(budget_ms: float = 10_000) -> Deadline:
    return Deadline.start(time.monotonic(), budget_ms, 0.0)


def test_one_round_trip_answers_each_request_on_its_own(store: RedisServer) -> None:
    """The requests a round trip serves together (one pipeline): a key of another type, or
    a value that is no number, is the refusal of the request that named it, saying what
    was found; every other request gets its rows (before, Redis's WRONGTYPE failed the
    whole pipeline, and every request of it was answered 503 "did not answer")."""
    held(store)
    view, packed = viewed(store, FLAT), viewed(store, PACKED)
    link = features._PlainRedis(view.store, 1.0)
    try:
        found = link.round_trip(
            [
                asked(view, 1),
                asked(view, [2, 9]),
                asked(view, [5]),
                asked(view, 8),
                asked(packed, [1]),
                asked(view, [2, "nobody"]),
            ]
        )
    finally:
        link.close()
    ones, string, listed, underscored, vector, missing = found
    assert isinstance(ones, np.ndarray)
    np.testing.assert_array_equal(ones, np.array([[0.5, -1.0, 0.2]], np.float32))
    assert isinstance(string, InvalidInput)
    assert string.message.startswith(
        "entities[1]: the feature store holds a string, not a hash, for entity 9 (key "
        "'cart:9'); the view's layout is hash"
    )
    assert isinstance(listed, InvalidInput)
    assert "holds a list, not a hash, for entity 5 (key 'cart:5')" in listed.message
    assert isinstance(underscored, InvalidInput)
    assert underscored.message.startswith(
        "entities: the feature store holds 'x' = '1_0' for entity 8 (key 'cart:8'), which is "
        "not a number"
    )
    assert isinstance(vector, np.ndarray)
    np.testing.assert_array_equal(vector, [[1.0, 2.0, 3.0]])
    assert isinstance(missing, np.ndarray)  # no hash: missing values (defaults, or a 422)
    assert np.isnan(missing[1]).all()
    assert not np.isnan(missing[0]).any()


@pytest.mark.anyio
async def test_a_bad_entity_is_a_422_naming_it_and_the_lookup_goes_on(store: RedisServer) -> None:
    held(store)
    view = viewed(store, FLAT)
    metrics = Metrics()
    lookup = features.FeatureLookup(metrics)
    try:
        with pytest.raises(InvalidInput, match=r"holds a string, not a hash, for entity 9 "):
            await lookup.observations("m", view, 9, deadline())
        with pytest.raises(InvalidInput, match=r"holds 'x' = '1_0' for entity 8 "):
            await lookup.observations("m", view, [8], deadline())
        with pytest.raises(InvalidInput, match=r"holds no 'x' for entity \"nobody\""):
            await lookup.observations("m", view, "nobody", deadline())
        rows, single = await lookup.observations("m", view, 2, deadline())
    finally:
        lookup.close()
    np.testing.assert_array_equal(rows, [[1.0, 0.0, -0.25]])
    assert single
    assert (
        metrics.registry.get_sample_value(
            "rlserve_feature_lookups_total", {"model": "m", "result": "error"}
        )
        is None
    )  # the store answered every time


@pytest.mark.anyio
async def test_a_store_that_refuses_connections_is_a_503_saying_so() -> None:
    """At once, quoting the error (before: "did not answer within" the whole timeout)."""
    view = FeatureView.model_validate(
        {**FLAT.model_dump(), "store": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 3000}
    )
    lookup = features.FeatureLookup(Metrics())
    try:
        with pytest.raises(ServiceUnavailable) as refused:
            await lookup.observations("m", view, 1, deadline())
    finally:
        lookup.close()
    message = refused.value.message
    assert "failed: ConnectionError: " in message
    assert "Connection refused" in message
    assert "did not answer" not in message


@pytest.mark.anyio
async def test_a_store_that_does_not_answer_is_a_503_saying_how_long_it_waited(
    tmp_path: Path,
) -> None:
    """A second's wait reads "1,000 ms" (before: "1e+03 ms"). The store is paused for
    longer than the request's deadline, shorter than the link's socket timeout."""
    with running_redis(tmp_path, persistent=False) as paused:
        view = viewed(paused, FLAT)
        with redis.Redis.from_url(paused.address()) as admin:
            admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        lookup = features.FeatureLookup(Metrics())
        try:
            with pytest.raises(ServiceUnavailable) as slow:
                await lookup.observations("m", view, 1, deadline(1000))
        finally:
            lookup.close()
    assert slow.value.retry_after_s == 1
    assert slow.value.message.startswith(
        f"model 'm': the feature store {view.store} did not answer within "
    )
    assert re.search(r"within (1,000|999\.\d) ms \(the view's timeout_ms", slow.value.message)


def test_waits_are_shown_in_plain_milliseconds() -> None:
    shown = [features._ms(s) for s in (1.0, 0.3, 2.5, 0.0025, 12.0, 0.00025)]
    assert shown == ["1,000 ms", "300 ms", "2,500 ms", "2.5 ms", "12,000 ms", "0.25 ms"]
