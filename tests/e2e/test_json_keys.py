"""A key given twice in one JSON object is refused on every JSON route, with one answer:
400 ``malformed_request``, naming the object and the key; never served as the last value.

One body per route, each valid but for the repeated key (written by hand: a dict cannot
hold a key twice), sent to a server that serves a policy and a language model, with the
admin routes enabled; the same bodies without the repeat are answered, so each refusal is
the repeat's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import DEMO, LM_MODEL, Exported, lm_repository
from tests.e2e.server import Server

TOKEN = "json-keys-admin-token"
OBS = "[0.01, -0.02, 0.03, 0.04]"
V2_INPUT = '"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": ' + OBS
CHAT = '"role": "user", "content": "Tell me about the fox."'

# (route, body with a key twice, where the message says it is, the same body valid)
CASES = [
    ("/v1/models/cartpole/predict", f'{{"observations": {OBS}, "observations": [0, 0, 0, 0]}}',
     'request body: the key(s) "observations"', f'{{"observations": {OBS}}}'),
    ("/v1/models/cartpole/predict", '{"observations": [{"pos": 1, "pos": 2}]}',
     'observations[0]: the key(s) "pos"', None),
    ("/v2/models/cartpole/infer", f'{{"inputs": [{{{V2_INPUT}, "name": "other"}}]}}',
     'inputs[0]: the key(s) "name"', f'{{"inputs": [{{{V2_INPUT}}}]}}'),
    ("/v2/models/cartpole/infer", f'{{"inputs": [{{{V2_INPUT}, "data": [1, 1, 1, 1]}}]}}',
     'inputs[0]: the key(s) "data"', f'{{"inputs": [{{{V2_INPUT}}}]}}'),
    ("/v2/models/cartpole/infer", f'{{"inputs": [{{{V2_INPUT}}}], "inputs": []}}',
     'request body: the key(s) "inputs"', f'{{"inputs": [{{{V2_INPUT}}}]}}'),
    ("/v2/models/cartpole/infer",
     f'{{"inputs": [{{{V2_INPUT}}}], "parameters": {{"seed": 1, "seed": 2}}}}',
     'parameters: the key(s) "seed"',
     f'{{"inputs": [{{{V2_INPUT}}}], "parameters": {{"seed": 1}}}}'),
    ("/v1/completions",
     f'{{"model": "{LM_MODEL}", "prompt": "The cat", "max_tokens": 4, "max_tokens": 100000}}',
     'request body: the key(s) "max_tokens"',
     f'{{"model": "{LM_MODEL}", "prompt": "The cat", "max_tokens": 4}}'),
    ("/v1/chat/completions",
     f'{{"model": "{LM_MODEL}", "messages": [{{{CHAT}, "content": "x"}}], "max_tokens": 4}}',
     'messages[0]: the key(s) "content"',
     f'{{"model": "{LM_MODEL}", "messages": [{{{CHAT}}}], "max_tokens": 4}}'),
    (f"/v1/models/{LM_MODEL}/generate",
     '{"prompt": "The cat", "max_new_tokens": 4, "max_new_tokens": 5}',
     'request body: the key(s) "max_new_tokens"', '{"prompt": "The cat", "max_new_tokens": 4}'),
    (f"/v1/models/{LM_MODEL}/score",
     '{"prompt": "The", "completions": [" cat"], "completions": [" dog"]}',
     'request body: the key(s) "completions"', '{"prompt": "The", "completions": [" cat"]}'),
    ("/v2/systemsharedmemory/region/keys/register",
     '{"key": "/a", "key": "/b", "offset": 0, "byte_size": 64}',
     'request body: the key(s) "key"', None),
    ("/v1/models/cartpole/versions/9", '{"path": "a/model.onnx", "path": "b/model.onnx"}',
     'request body: the key(s) "path"', None),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(exported: Exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("json-keys")
    repository = lm_repository(exported, tmp, 1)
    (repository / "cartpole").symlink_to(DEMO)
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN}
    running = Server.rlserve(repository, "--allow-client-shm", env=env, log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def send(http: httpx.Client, route: str, body: str) -> httpx.Response:
    method = "PUT" if "/versions/" in route else "POST"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    return http.request(method, route, content=body, headers=headers)


@pytest.mark.parametrize(("route", "body", "where", "valid"), CASES)
def test_a_key_given_twice_is_refused_on_every_json_route(
    server: Server, route: str, body: str, where: str, valid: str | None
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = send(http, route, body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        message = error["message"] if isinstance(error, dict) else answer.json()["error"]
        assert f"{where} appear more than once in one object" in message, message
        if valid is not None:
            assert send(http, route, valid).status_code == 200
