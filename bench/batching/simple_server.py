"""The baseline: the simplest server a user would write around the synthetic model: Flask, one
sync gunicorn worker, plain ``pickle.loads``, one model call per request.

    gunicorn -w 1 -k sync -b 127.0.0.1:PORT bench.batching.simple_server:app
"""

from __future__ import annotations

import pickle

from flask import Flask, request

from bench.batching.synthetic import SyntheticSettings, model_call
from common.configuration.config import from_env

app = Flask(__name__)
settings = from_env(SyntheticSettings, "synthetic")


@app.post("/")
def score() -> bytes:
    # Trusted benchmark traffic only: a real server must not unpickle network bodies.
    payload = pickle.loads(request.get_data())
    scores = model_call(payload["images"], settings)
    return pickle.dumps({"scores": scores, "outputs": scores})
