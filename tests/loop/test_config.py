"""The loop's configuration (loop/config.py): the reference files load unchanged and map as
docs/rl-loop.md says; files combine; the environment and flags override; bad values are
refused with messages that name the field, the value and what is valid."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import pytest

from kernel.errors import ConfigError
from loop import config as loop_config
from loop.buffers import memory, open_consumer, open_producer
from loop.buffers.base import BufferOptions, Overflow
from loop.commands import CollectArgs, resolve
from loop.config import LoopConfig, load, parse_duration, parse_gpus
from loop.controller import Fallback
from tests.loop.buffers.contract import make_step

ROOT = Path(__file__).resolve().parents[2]
# The reference shapes (README.md there): outside the repository, so copied here verbatim.
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
REFERENCE = ROOT / "configs"  # the deployment guides' files, as written
RL_CONFIG = REFERENCE / "rl_config.yaml"
DECOUPLED = REFERENCE / "decoupled_config.yaml"
SYNC_POLICY = REFERENCE / "sync_policy.yaml"
TOKEN = "loop-test-token-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RLSERVE_LOOP_* or server token from the machine leaks into a test."""
    for name in list(os.environ):
        if name.startswith(loop_config.ENV_PREFIX) or name == loop_config.SERVER_TOKEN_ENV:
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str | None = None) -> Path:
    path = tmp_path / (name or f"{uuid4().hex}.yaml")
    path.write_text(text)
    return path


def refused(*files: Path, **overrides: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load(*files, **overrides)
    return caught.value.message


# -- the reference files, unchanged -------------------------------------------------------


@pytest.mark.parametrize("name", ["rl_config.yaml", "decoupled_config.yaml", "sync_policy.yaml"])
def test_the_copies_of_the_reference_files_are_verbatim(name):
    if not SHARED_REFERENCE.is_dir():
        pytest.skip(f"{SHARED_REFERENCE} (the shared reference shapes) is not on this machine")
    assert (REFERENCE / name).read_bytes() == (SHARED_REFERENCE / name).read_bytes()


def test_rl_config_loads_unchanged_as_a_co_located_run():
    config = load(RL_CONFIG)
    assert config.cluster_mode == "co-located"
    assert config.gpu_allocation.inference == (0, 1, 2, 3) == config.gpu_allocation.training
    assert config.cuda_visible_devices("inference") == "0,1,2,3"
    assert config.cuda_visible_devices("training") == "0,1,2,3"
    assert config.task_schedule.inference_interval == pytest.approx(0.010)
    assert config.task_schedule.training_interval == pytest.approx(0.050)
    # Co-located: experience stays in the process.
    assert config.buffer_type == "memory"
    assert config.producer_buffer_url() == config.consumer_buffer_url() == "memory://rl_experience"


def test_decoupled_config_loads_unchanged_as_a_decoupled_run():
    config = load(DECOUPLED)
    assert config.cluster_mode == "decoupled"
    assert config.server_url() == "http://10.0.0.1:8000"
    assert config.training_cluster.endpoint == "10.0.0.2:8001"
    assert config.trainer_metrics_address() == ("0.0.0.0", 8001)
    assert config.buffer_type == "kafka"
    assert config.topic == "rl_experience"
    assert config.consumer_buffer_url() == "kafka://localhost:9092/rl_experience?partitions=16"
    assert (
        config.producer_buffer_url()
        == "kafka://localhost:9092/rl_experience?partitions=16&group=trainer"
    )
    assert (config.consumer_group, config.consumer_name) == ("trainer", "trainer-0")
    assert config.offline_buffer_url() is None  # the fallback is drop unless a policy says
    assert config.cuda_visible_devices("training") == ""  # no gpu_allocation: Kubernetes's job


def test_sync_policy_loads_unchanged_into_the_controllers_settings():
    config = load(SYNC_POLICY)
    assert config.sync_controller_kwargs() == {"max_staleness": 100, "fallback": Fallback.OFFLINE}
    assert config.offline_buffer_url() == "memory://rl_experience_offline"


def test_decoupled_config_and_sync_policy_combine_into_one_run():
    config = load(DECOUPLED, SYNC_POLICY)
    assert config.cluster_mode == "decoupled"
    assert config.sync_policy.max_staleness == 100
    # The offline stream: the same cluster, <topic>_offline, no producer back-pressure group.
    assert config.offline_buffer_url() == (
        "kafka://localhost:9092/rl_experience_offline?partitions=16"
    )
    assert load(SYNC_POLICY, DECOUPLED) == config.model_copy(
        update={"config_file": [SYNC_POLICY, DECOUPLED]}
    )


def test_the_generated_urls_are_what_the_backends_accept():
    from loop.buffers.kafka import parse_url as parse_kafka_url
    from loop.buffers.redis_streams import parse_url as parse_redis_url

    kafka = parse_kafka_url(load(DECOUPLED, SYNC_POLICY).producer_buffer_url())
    assert (kafka.bootstrap, kafka.topic, kafka.partitions) == (
        "localhost:9092",
        "rl_experience",
        16,
    )
    assert kafka.groups == ("trainer",)
    offline = parse_kafka_url(load(DECOUPLED, SYNC_POLICY).offline_buffer_url() or "")
    assert (offline.topic, offline.groups) == ("rl_experience_offline", ())
    redis = parse_redis_url(load(DECOUPLED, data_buffer={"type": "redis"}).producer_buffer_url())
    assert (redis.stream, redis.client_url) == ("rl_experience", "redis://localhost:6379/0")


# -- files, environment, flags --------------------------------------------------------------


def test_a_later_file_wins_field_by_field(tmp_path):
    first = write(tmp_path, "data_buffer: {type: kafka, topic: a, partition: 4}\n")
    second = write(tmp_path, "data_buffer: {topic: b}\ncluster_mode: decoupled\n")
    config = load(first, second)
    assert (config.data_buffer.topic, config.data_buffer.partition) == ("b", 4)
    assert config.cluster_mode == "decoupled"


def test_the_environment_overrides_files_and_flags_override_both(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSERVE_LOOP_SYNC_POLICY__MAX_STALENESS", "8")
    monkeypatch.setenv("RLSERVE_LOOP_DATA_BUFFER__BROKERS", "kafka-0:9092,kafka-1:9092")
    config = load(DECOUPLED, SYNC_POLICY)
    assert config.sync_policy.max_staleness == 8
    assert config.sync_policy.fallback_strategy == "offline"  # the file's, not replaced
    assert urlsplit(config.consumer_buffer_url()).netloc == "kafka-0:9092,kafka-1:9092"
    flagged = load(DECOUPLED, SYNC_POLICY, sync_policy={"max_staleness": 3}, rollout=None)
    assert flagged.sync_policy.max_staleness == 3
    assert flagged.sync_policy.fallback_strategy == "offline"


def test_a_whole_section_may_come_from_the_environment_as_json(monkeypatch):
    monkeypatch.setenv("RLSERVE_LOOP_TASK_SCHEDULE", '{"inference_interval": "20ms"}')
    config = load(RL_CONFIG)
    assert config.task_schedule.inference_interval == pytest.approx(0.020)
    assert config.task_schedule.training_interval == pytest.approx(0.050)  # the file's


def test_config_files_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(
        "RLSERVE_LOOP_CONFIG_FILE", os.pathsep.join(map(str, (DECOUPLED, SYNC_POLICY)))
    )
    config = load()
    assert config.cluster_mode == "decoupled"
    assert config.sync_policy.max_staleness == 100
    assert config.config_file == [DECOUPLED, SYNC_POLICY]
    assert load(RL_CONFIG).cluster_mode == "co-located"  # files given to load come first


def test_defaults_without_any_file():
    config = load()
    assert config.cluster_mode == "co-located"
    assert config.server_url() == "http://127.0.0.1:8000"
    assert config.sync_controller_kwargs() == {"max_staleness": None, "fallback": Fallback.DROP}
    assert config.buffer_options() == BufferOptions()
    assert config.rollout.env_id == "CartPole-v1"


# -- the admin token: environment only ----------------------------------------------------------


def test_the_admin_token_comes_from_the_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSERVE_ADMIN_TOKEN", TOKEN)  # the server's variable: one Secret
    token = load(DECOUPLED).admin_token
    assert token is not None
    assert token.get_secret_value() == TOKEN
    monkeypatch.setenv("RLSERVE_LOOP_ADMIN_TOKEN", TOKEN + "-loop")
    token = load(DECOUPLED).admin_token
    assert token is not None
    assert token.get_secret_value() == TOKEN + "-loop"
    assert TOKEN not in json.dumps(load(DECOUPLED).resolved())
    in_file = write(tmp_path, f"admin_token: {TOKEN}\n")
    message = refused(DECOUPLED, in_file)
    assert "admin_token is not read from files" in message
    assert "RLSERVE_LOOP_ADMIN_TOKEN" in message
    assert TOKEN not in message


@pytest.mark.parametrize(
    ("token", "why"), [("short", "16 characters"), ("two words here, long enough", "whitespace")]
)
def test_a_bad_admin_token_is_refused_without_echoing_it(monkeypatch, token, why):
    monkeypatch.setenv("RLSERVE_LOOP_ADMIN_TOKEN", token)
    message = refused()
    assert "admin_token" in message
    assert why in message
    assert token not in message


# -- buffers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "consumer", "offline"),
    [
        (
            {"type": "redis", "redis": "buffer:6379/1"},
            "redis://buffer:6379/1?stream=rl_experience",
            "redis://buffer:6379/1?stream=rl_experience_offline",
        ),
        (
            {"type": "file", "directory": "/var/lib/exp", "topic": "cartpole"},
            "file:///var/lib/exp/cartpole",
            "file:///var/lib/exp/cartpole_offline",
        ),
        ({"type": "memory", "topic": "x"}, "memory://x", "memory://x_offline"),
        (
            {"type": "kafka", "brokers": ["k0:9092", "k1:9092"], "partition": 4},
            "kafka://k0:9092,k1:9092/rl_experience?partitions=4",
            "kafka://k0:9092,k1:9092/rl_experience_offline?partitions=4",
        ),
    ],
)
def test_each_buffer_type_makes_its_urls(section, consumer, offline):
    config = load(data_buffer=section, sync_policy={"fallback_strategy": "offline"})
    assert config.consumer_buffer_url() == consumer
    assert config.offline_buffer_url() == offline
    if section["type"] != "kafka":
        assert config.producer_buffer_url() == consumer  # these measure every group
    else:
        assert config.producer_buffer_url() == consumer + "&group=trainer"


def test_a_direct_url_replaces_the_parts(tmp_path):
    config = load(
        DECOUPLED,
        SYNC_POLICY,
        data_buffer={"url": "redis://cache:6379/0?stream=exp&socket_timeout=5"},
    )
    assert config.buffer_type == "redis"
    assert config.topic == "exp"
    assert config.producer_buffer_url() == "redis://cache:6379/0?stream=exp&socket_timeout=5"
    assert config.offline_buffer_url() == "redis://cache:6379/0?socket_timeout=5&stream=exp_offline"
    kafka = load(DECOUPLED, SYNC_POLICY, data_buffer={"url": "kafka://b:9092/t?partitions=2"})
    assert kafka.producer_buffer_url() == "kafka://b:9092/t?partitions=2&group=trainer"
    grouped = load(data_buffer={"url": "kafka://b:9092/t?group=a,b"})
    assert grouped.producer_buffer_url() == "kafka://b:9092/t?group=a,b"  # as given
    named = load(SYNC_POLICY, data_buffer={"url": "kafka://b:9092/t?group=a"})
    assert named.offline_buffer_url() == "kafka://b:9092/t_offline"
    custom = load(SYNC_POLICY, sync_policy={"offline_topic": "for_dpo"})
    assert custom.offline_buffer_url() == "memory://for_dpo"


def test_buffer_options_and_the_consumer_name():
    config = load(
        data_buffer={
            "max_pending": 4096,
            "publish_timeout_s": 1.5,
            "overflow": "drop",
            "compression": "zstd",
            "max_record_bytes": 1 << 20,
            "group": "ppo",
            "consumer": "ppo-a",
        }
    )
    assert config.buffer_options() == BufferOptions(
        max_pending=4096,
        overflow=Overflow.DROP,
        publish_timeout_s=1.5,
        compression="zstd",
        max_record_bytes=1 << 20,
    )
    assert (config.consumer_group, config.consumer_name) == ("ppo", "ppo-a")
    assert load(data_buffer={"group": "ppo"}).consumer_name == "ppo-0"


@pytest.fixture
def topic() -> Iterator[str]:
    name = f"cfg_{uuid4().hex}"
    yield name
    memory.discard(f"memory://{name}")
    memory.discard(f"memory://{name}_offline")


def test_open_sync_controller_routes_over_stale_records_to_the_offline_stream(topic):
    config = load(SYNC_POLICY, data_buffer={"topic": topic}, sync_policy={"max_staleness": 1})
    producer = open_producer(config.producer_buffer_url())
    producer.publish([make_step("old", 0, version=1), make_step("new", 0, version=5)])
    offline = open_consumer(config.offline_buffer_url() or "", "dpo", "dpo-0")
    with config.open_sync_controller(version=5) as side:
        batch = side.controller.next_batch(10, timeout_s=0.5)
        assert [s.episode_id for s in batch.steps] == ["new"]
        side.controller.commit(batch)
        assert side.controller.accounting().routed_offline == 1
    assert [d.step.stream for d in offline.poll(10, timeout_s=0.5)] == ["old"]
    offline.close()
    producer.close()


# -- values --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "indices"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("0,2", (0, 2)),
        ("0-1, 4", (0, 1, 4)),
        (2, (2,)),
        ([0, 1], (0, 1)),
        (["0-1", 3], (0, 1, 3)),
        ([], ()),
        ("", ()),
        (None, ()),
    ],
)
def test_gpu_sets_parse(given, indices):
    assert parse_gpus(given) == indices


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("3-0", "runs backwards"),
        ("0-3,2", "names a GPU twice"),
        ("gpu0", "not a GPU index or range"),
        (-1, "not a GPU index or range"),
        (True, "not a GPU index"),
        ({"a": 1}, "not a GPU set"),
    ],
)
def test_bad_gpu_sets_say_what_to_write(given, why):
    with pytest.raises(ValueError, match=why):
        parse_gpus(given)


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("10ms", 0.010), ("50ms", 0.050), ("0.5s", 0.5), ("2s", 2.0), (" 1.5 ms ", 0.0015)],
)
def test_durations_parse_with_their_units(given, seconds):
    assert parse_duration(given) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (10, "has no unit"),
        ("10", "not a duration"),
        ("10m", "not a duration"),
        ("1h", "not a duration"),
        ("0ms", "longer than zero"),
        ("-5ms", "not a duration"),
    ],
)
def test_bad_durations_say_what_to_write(given, why):
    with pytest.raises(ValueError, match=why):
        parse_duration(given)


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("10.0.0.1:8000", "http://10.0.0.1:8000"),
        ("rlserve:80", "http://rlserve:80"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("https://policy.example.com/", "https://policy.example.com"),
    ],
)
def test_the_inference_endpoint_becomes_the_server_url(endpoint, url):
    assert load(inference_cluster={"endpoint": endpoint}).server_url() == url


# -- refusals name the field, the value and what is valid ----------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (
            {"cluster_mode": "colocated"},
            ["cluster_mode", "'colocated'", "'co-located' or 'decoupled'"],
        ),
        ({"gpu_allocation": {"inference": "3-0"}}, ["gpu_allocation.inference", "'3-0'", "'0-3'"]),
        (
            {"task_schedule": {"inference_interval": 10}},
            ["task_schedule.inference_interval", "10", "'10ms'"],
        ),
        (
            {"inference_cluster": {"endpoint": "10.0.0.1"}},
            ["inference_cluster.endpoint", "'10.0.0.1'", "HOST:PORT"],
        ),
        (
            {"inference_cluster": {"endpoint": "h:99999"}},
            ["inference_cluster.endpoint", "'h:99999'", "0-65535"],
        ),
        (
            {"inference_cluster": {"endpoint": "grpc://h:8001"}},
            ["inference_cluster.endpoint", "http or https"],
        ),
        (
            {"training_cluster": {"endpoint": "10.0.0.2"}},
            ["training_cluster.endpoint", "HOST:PORT"],
        ),
        (
            {"data_buffer": {"type": "rabbitmq"}},
            ["data_buffer.type", "'rabbitmq'", "'kafka', 'redis', 'file' or 'memory'"],
        ),
        ({"data_buffer": {"partition": 0}}, ["data_buffer.partition", "greater than 0", "(got 0)"]),
        (
            {"data_buffer": {"topic": "rl experience"}},
            ["data_buffer.topic", "'rl experience'", "letters, digits"],
        ),
        ({"data_buffer": {"brokers": "kafka"}}, ["data_buffer.brokers", "'kafka'", "HOST:PORT"]),
        ({"data_buffer": {"group": ""}}, ["data_buffer.group", "consumer group empty", "1 to 200"]),
        (
            {"data_buffer": {"group": "g" * 201}},
            ["data_buffer.group", "(201 characters)", "1 to 200 letters, digits"],
        ),
        ({"data_buffer": {"directory": "relative/dir"}}, ["data_buffer.directory", "absolute"]),
        (
            {"data_buffer": {"url": "amqp://q"}},
            ["data_buffer.url", "'amqp://q'", "kafka://HOST:PORT/TOPIC"],
        ),
        ({"data_buffer": {"overflow": "discard"}}, ["data_buffer.overflow", "'block' or 'drop'"]),
        (
            {"sync_policy": {"fallback_strategy": "route"}},
            ["sync_policy.fallback_strategy", "'drop', 'offline' or 'keep'"],
        ),
        (
            {"sync_policy": {"max_staleness": -1}},
            ["sync_policy.max_staleness", "greater than or equal to 0"],
        ),
        ({"rollout": {"num_envs": 0}}, ["rollout.num_envs", "greater than 0"]),
        (
            {"data_buffer": {"partitions": 16}},
            ["data_buffer.partitions", "unknown field", "partition,"],
        ),
        ({"sync_polcy": {}}, ["sync_polcy", "unknown field", "sync_policy"]),
        (
            {"cluster_mode": "decoupled", "data_buffer": {"type": "memory"}},
            ["data_buffer.type", "memory", "kafka, redis, or file"],
        ),
    ],
)
def test_bad_values_are_refused_naming_field_value_and_what_is_valid(overrides, fragments):
    message = refused(**overrides)
    assert message.startswith("invalid loop configuration: ")
    for fragment in fragments:
        assert fragment in message, message


def test_file_problems_name_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert f"config_file: {missing} does not exist" in refused(missing)
    broken = write(tmp_path, "cluster_mode: [decoupled\n")
    assert f"{broken}: not valid YAML" in refused(broken)
    listed = write(tmp_path, "- decoupled\n")
    assert f"{listed}: expected a mapping of settings, got list" in refused(listed)
    typo = write(tmp_path, "data_buffer:\n  typ: kafka\n")
    assert "data_buffer.typ: unknown field; valid here: type," in refused(typo)


# -- nothing at import; the commands ---------------------------------------------------------


def test_importing_reads_nothing_and_loads_no_buffer_client():
    probe = (
        "import sys, loop.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('msgpack', 'redis', 'confluent_kafka', 'zstandard', 'gymnasium', 'loop.buffers')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RLSERVE_LOOP_CONFIG_FILE": "/nonexistent.yaml"},
    )
    assert done.stdout.split() == ["[]"]


def test_python_m_loop_config_shows_what_the_files_mean(capsys):
    assert loop_config.main([str(DECOUPLED), str(SYNC_POLICY)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (
        shown["buffer"]["offline_url"]
        == "kafka://localhost:9092/rl_experience_offline?partitions=16"
    )
    assert shown["sync_controller"] == {"max_staleness": 100, "fallback": "offline"}
    assert loop_config.main(["/nonexistent.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_collect_takes_its_settings_from_the_config_and_flags_win(tmp_path, monkeypatch):
    ours = write(
        tmp_path,
        "rollout: {env_id: Acrobot-v1, num_envs: 32, seed: 7}\n"
        "inference_cluster: {model: cartpole}\n",
    )
    given = resolve(CollectArgs(config=[str(DECOUPLED), str(SYNC_POLICY), str(ours)]))
    assert (given.env, given.num_envs, given.seed, given.model) == ("Acrobot-v1", 32, 7, "cartpole")
    assert given.server == "http://10.0.0.1:8000"
    assert given.buffer == "kafka://localhost:9092/rl_experience?partitions=16&group=trainer"
    assert given.buffer_options == BufferOptions()
    flagged = resolve(
        CollectArgs(config=[str(DECOUPLED)], num_envs=4, server="http://s:1", buffer="file:///x")
    )
    assert (flagged.num_envs, flagged.server, flagged.buffer) == (4, "http://s:1", "file:///x")
    monkeypatch.setenv("RLSERVE_LOOP_CONFIG_FILE", str(DECOUPLED))
    assert resolve(CollectArgs()).server == "http://10.0.0.1:8000"


def test_collect_without_a_config_needs_its_flags():
    with pytest.raises(ConfigError, match="needs --server, --buffer, or a --config file"):
        resolve(CollectArgs(env="CartPole-v1"))
    plain = resolve(CollectArgs(env="CartPole-v1", server="http://s:1", buffer="memory://b"))
    assert (plain.num_envs, plain.retry_for_s, plain.vectorization) == (8, 60.0, "auto")
    assert plain.buffer_options is None


# -- the documentation ------------------------------------------------------------------------


def fields(model: type[Any], prefix: str = "") -> list[str]:
    names = []
    for name, info in model.model_fields.items():
        if name == "config_file":
            continue
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            names += fields(annotation, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def test_the_docs_table_names_every_field():
    docs = (ROOT / "docs" / "rl-loop.md").read_text()
    section = docs.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    shown = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)?)`", section))
    assert set(fields(LoopConfig)) - shown == set()
