"""The transports: every way a call reaches a model, in one place.

Each frontend decodes its wire format into the data plane's neutral messages and encodes the
answer; the steps between (deadline, admission, validation, submission) are the data
plane's call pipeline (``serve.dataplane.row_calls``), written once. Beside the frontends sit
what the HTTP ones share: the call envelope (``http_calls``), JSON decoding with each key given
once (``wire``) and the access log (``access``).

- ``predict``: ``POST /predict`` and ``/v1/models/{m}/predict``, JSON;
- ``oip``: the Open Inference Protocol over REST and gRPC, with system shared memory;
- ``lane``: the local shared-memory lane;
- ``lm``: a language model's generate and score routes and the OpenAI API.
"""
