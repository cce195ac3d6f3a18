"""The app factory: any ``Scorer`` becomes a Flask app with the endpoints of DESIGN 3."""

from __future__ import annotations

import hmac
import logging
import os
import time
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from common import __version__, metrics
from common.config import describe, from_env
from common.devices import GPU_ENV
from common.errors import PayloadTooLarge, ScorerError, Unauthorized
from common.protocol import decode_body, encode_body, wire_format
from common.registry import load_scorer_class
from common.runtime import ScorerRuntime
from common.scorer import Scored, Scorer
from common.settings import CoreSettings

log = logging.getLogger(__name__)

SCORE_ROUTES = ("/", "/score")


def answer(obj: dict[str, Any], status: int = 200) -> Response:
    """Encode ``obj`` in the format the client spoke (pickle unless it sent JSON)."""
    body, mimetype = encode_body(obj, wire_format(request.content_type))
    return Response(body, status=status, mimetype=mimetype)


def read_body(limit: int) -> bytes:
    """The request body, refused with 413 before reading when it is declared too large."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"body of {declared} bytes; the limit is {limit}")
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"body over the limit of {limit} bytes")
    return body


def collate(results: list[float | Scored]) -> dict[str, Any]:
    """Results to the answer: ``scores`` and ``outputs`` (flow_grpo reads ``outputs``), plus one
    per-sample list for each extras key of ``Scored`` results."""
    scores = [float(r.score if isinstance(r, Scored) else r) for r in results]
    out: dict[str, Any] = {"scores": scores, "outputs": scores}
    keys = {key for r in results if isinstance(r, Scored) for key in r.extras}
    for key in sorted(keys):
        out[key] = [r.extras.get(key) if isinstance(r, Scored) else None for r in results]
    return out


def create_app(scorer: Scorer | None = None) -> Flask:
    """Build the app of ``scorer`` and start loading its model in the background. Default: the
    scorer of the service ``SCORER_SERVICE`` names (``common.registry``), with the ``SCORER_*``
    settings; tests pass their own."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    if scorer is None:
        core = from_env(CoreSettings)
        scorer = load_scorer_class(core.service)(core)
    core = scorer.core
    service = scorer.name
    runtime = ScorerRuntime(scorer)

    app = Flask(f"scorer.{service}")
    app.extensions["scorer_runtime"] = runtime

    @app.before_request
    def check_token() -> None:
        g.started = time.perf_counter()
        if core.auth_token and request.method == "POST":
            # RFC 9110 11.1: the scheme name is case-insensitive ("bearer" is "Bearer").
            scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), core.auth_token.encode()):
                raise Unauthorized("missing or wrong bearer token")

    @app.errorhandler(ScorerError)
    def scorer_error(error: ScorerError) -> Response:
        if error.status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.path, error.status, error.message)
        return answer({"error": error.message}, error.status)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        return answer({"error": f"{error.name}: {error.description}"}, error.code or 500)

    @app.errorhandler(Exception)
    def internal_error(error: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.path)
        return answer({"error": f"internal error: {type(error).__name__}: {error}"}, 500)

    @app.after_request
    def count(response: Response) -> Response:
        if request.method == "POST":
            route = request.url_rule.rule if request.url_rule else "unmatched"
            metrics.REQUESTS.labels(service, route, str(response.status_code)).inc()
            metrics.LATENCY.labels(service, route).observe(time.perf_counter() - g.get("started", time.perf_counter()))
            if response.status_code >= 400:
                metrics.ERRORS.labels(service, str(response.status_code)).inc()
        return response

    def score_view() -> Response:
        body = read_body(core.max_body_bytes)
        payload = decode_body(body, wire_format(request.content_type))
        runtime.wait_ready()
        items = runtime.decode(payload)
        return answer(collate(runtime.run(items)))

    for rule in SCORE_ROUTES:
        app.add_url_rule(rule, endpoint=f"score{rule}", view_func=score_view, methods=["POST"])

    @app.get("/health")
    def health() -> Response:
        return jsonify(status="ok", pid=os.getpid())

    @app.get("/ready")
    def ready() -> tuple[Response, int]:
        if runtime.ready:
            return jsonify(ready=True), 200
        return jsonify(ready=False, reason=runtime.setup_error or "model is loading"), 503

    @app.get("/info")
    def info() -> Response:
        return jsonify(
            service=service,
            version=__version__,
            scorer=type(scorer).__name__,
            device=runtime.device,
            gpu=os.environ.get(GPU_ENV),
            ready=runtime.ready,
            setup_error=runtime.setup_error,
            # A scorer that scores requests itself batches its own stages (see its model info).
            batching={"max_batch": runtime.max_batch, "max_wait_ms": runtime.max_wait_ms, "max_queue": core.max_queue}
            if not scorer.scores_requests()
            else {"stages": True, "max_queue": core.max_queue},
            settings=describe(core),
            model=scorer.info(),
            pid=os.getpid(),
        )

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, content_type=content_type)

    for blueprint in scorer.blueprints():
        app.register_blueprint(blueprint)

    runtime.start()
    return app
