"""The plain FastAPI baseline: what a first attempt at serving a policy looks like.

One onnxruntime run per request, inline on the event loop; no validation, no batching, no
metrics. ``uvicorn --factory bench.baseline:create_app`` with BASELINE_MODEL set.
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

_DTYPES = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int64)": np.int64}


def create_app() -> FastAPI:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        os.environ["BASELINE_MODEL"], options, providers=["CPUExecutionProvider"]
    )
    first = session.get_inputs()[0]
    input_name, dtype = first.name, _DTYPES[first.type]
    app = FastAPI()

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        body = orjson.loads(await request.body())
        obs = np.asarray(body["observations"], dtype=dtype)
        (action,) = session.run(["action"], {input_name: obs[np.newaxis]})
        return Response(
            orjson.dumps({"actions": action[0].tolist()}), media_type="application/json"
        )

    return app
