"""The app factory: any ``Scorer`` becomes a Flask app: its protocols' routes (``common.server.protocols``)
on one request path, and ``/health``, ``/ready``, ``/info``, ``/metrics``.

The request path (``serve``), for every protocol, in order: the deadline and the bearer token
(``start_request``), the body read under its limit, parsed into a payload, the wait for the
model, the payload prepared into items, the items scored, the answer encoded."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from common import __version__
from common.configuration.config import deprecations, describe, from_env
from common.configuration.devices import GPU_ENV
from common.configuration.settings import CoreSettings
from common.limits.clients import client_of, request_client, trusted_networks
from common.limits.deadlines import Deadline, request_deadline
from common.limits.errors import (
    InternalError,
    Overloaded,
    PayloadTooLarge,
    ScorerError,
    Unauthorized,
    Unprocessable,
    describe_error,
    quote,
)
from common.pipeline import metrics
from common.pipeline.runtime import RequestLimits, ScorerRuntime
from common.pipeline.scorer import Scorer
from common.server.auth import bearer_token_matches
from common.server.protocols import WireProtocol
from common.server.worker import ARRIVED_KEY
from common.setup import registry

log = logging.getLogger(__name__)


def read_body(limit: int) -> bytes:
    """The request body (the worker has read it whole), refused with 413 when it is too large."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"body of {declared} bytes; the limit is {limit}")
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"body over the limit of {limit} bytes")
    return body


def settings_sections(service: str) -> list[tuple[str, type]]:
    """(section, settings class) of what the service reads: the core's, its own and each of its
    members' (``multi``: each reward's); a scorer without a registry entry (a test's) only the core's."""
    sections: list[tuple[str, type]] = [("", CoreSettings)]
    if service in registry.SERVICES:
        for name in [service, *registry.members(service)]:
            own = registry.settings_class(name)
            sections += [(name, own)] if own else []
    return sections


def create_app(scorer: Scorer | None = None, protocols: Sequence[type[WireProtocol]] = ()) -> Flask:
    """Build the app of ``scorer`` and start loading its model in the background. Default: the
    scorer and protocols of the service ``SCORER_SERVICE`` names (``common.setup.registry``), with the
    ``SCORER_*`` settings; tests pass their own. Every app speaks the core protocol."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    if scorer is None:
        core = from_env(CoreSettings)
        scorer = registry.load_scorer_class(core.service)(core)
        protocols = [registry.load_class(path) for path in registry.get(core.service).protocols]
    core = scorer.core
    service = scorer.name
    sections = settings_sections(service)
    deprecated = [message for section, cls in sections for message in deprecations(cls, section)]
    for message in deprecated:
        log.warning(message)
    own = {section: describe(from_env(cls, section)) for section, cls in sections[1:]}
    trusted = trusted_networks(core.trusted_proxies)
    runtime = ScorerRuntime(scorer)
    limits = RequestLimits(core)

    app = Flask(f"scorer.{service}")
    spoken = [WireProtocol(scorer), *(protocol(scorer) for protocol in protocols)]
    protocol_of: dict[str, WireProtocol] = {}  # endpoint -> its protocol

    def current_protocol() -> WireProtocol:
        """The protocol of the route requested; the core's on any other path."""
        return protocol_of.get(request.endpoint or "", spoken[0])

    def answer(obj: dict[str, Any], status: int = 200) -> Response:
        body, mimetype = current_protocol().encode(obj, request.content_type)
        return Response(body, status=status, mimetype=mimetype)

    @app.before_request
    def start_request() -> None:
        """One deadline per request, from when it arrived (the worker had it whole), for every
        stage it goes through; then the token."""
        g.started = time.perf_counter()
        g.scope = contextlib.ExitStack()
        g.scope.enter_context(request_deadline(Deadline(core.request_timeout_s, request.environ.get(ARRIVED_KEY))))
        connection = request.environ.get("gunicorn.socket")
        g.scope.enter_context(request_client(client_of(request.environ, trusted), connection))
        token = core.auth_token
        if token and request.method == "POST" and not bearer_token_matches(request.headers.get("Authorization"), token):
            raise Unauthorized("missing or wrong bearer token")

    @app.teardown_request
    def end_request(_: BaseException | None) -> None:
        if (scope := g.pop("scope", None)) is not None:
            scope.close()

    @app.errorhandler(ScorerError)
    def scorer_error(error: ScorerError) -> Response:
        status = current_protocol().status(error, request.content_type)
        if status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.path, status, error.message)
        response = answer({"error": error.message}, status)
        if isinstance(error, Overloaded) and error.retry_after_s is not None:
            response.headers["Retry-After"] = str(error.retry_after_s)
        return response

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        return answer({"error": f"{error.name}: {error.description}"}, error.code or 500)

    @app.errorhandler(Exception)
    def internal_error(error: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.path)
        fault = InternalError(f"internal error: {describe_error(error)}")
        return answer({"error": fault.message}, current_protocol().status(fault, request.content_type))

    @app.after_request
    def count(response: Response) -> Response:
        if request.method == "POST":
            route = request.url_rule.rule if request.url_rule else "unmatched"
            metrics.REQUESTS.labels(service, route, str(response.status_code)).inc()
            metrics.LATENCY.labels(service, route).observe(time.perf_counter() - g.get("started", time.perf_counter()))
            if response.status_code >= 400:
                metrics.ERRORS.labels(service, str(response.status_code)).inc()
        return response

    def serve(protocol: WireProtocol) -> Callable[[], Response]:
        """The one request path, for every protocol: body, payload, readiness, items, results, answer."""

        def view() -> Response:
            query = list(request.args.items(multi=True))
            if query and not scorer.reads_query:
                # A trainer given a multi service's URL (``?ocr=0.5&pickscore=0.5``) would get
                # this scorer's score alone for the weighted sum it asked for.
                readers = " or ".join(f"the {s.name} service's (port {s.port})" for s in registry.joint_services())
                raise Unprocessable(
                    f"the {service} service reads nothing in the URL's query (it has {quote(dict(query))}); "
                    f"rewards and weights there are {readers}"
                )
            stages = metrics.Stages(service)
            arrived = request.environ.get(ARRIVED_KEY)
            if arrived is not None:  # the head whole -> a thread runs it: the body's bytes, the thread pool
                stages.observe("arrival", time.monotonic() - arrived)
            with stages("parse"):
                payload = protocol.parse(read_body(core.max_body_bytes), request.content_type)
            with stages("ready"):
                runtime.wait_ready()
            # The bytes its items hold (decoded images, model inputs) count from when they are
            # declared until its results are in.
            with limits.request():
                samples = limits.prepare(lambda: protocol.items(payload, query), stages)
                with stages("score"):  # the batch queue and the model
                    results = samples.results(runtime.score(samples.items))
            with stages("answer"):
                return answer(protocol.answer(results))

        return view

    # A service's protocol may answer on the core's routes (with a superset of its answer); the
    # core keeps those no other protocol takes.
    taken: set[str] = set()
    for protocol in [*spoken[1:], spoken[0]]:
        for rule in protocol.routes:
            if rule in taken:
                continue
            taken.add(rule)
            endpoint = f"{protocol.name}{rule}"
            protocol_of[endpoint] = protocol
            app.add_url_rule(rule, endpoint=endpoint, view_func=serve(protocol), methods=["POST"])

    @app.get("/health")
    def health() -> Response:
        return jsonify(status="ok", pid=os.getpid())

    @app.get("/ready")
    def ready() -> tuple[Response, int]:
        if not runtime.ready:
            return jsonify(ready=False, reason=runtime.setup_error or "model is loading"), 503
        problem = scorer.ready_problem()
        if problem:
            return jsonify(ready=False, reason=problem), 503
        return jsonify(ready=True), 200

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
            batching=runtime.batching(),
            settings=describe(core),
            service_settings=own,
            deprecated_settings=deprecated,
            model=scorer.info(),
            pid=os.getpid(),
        )

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, content_type=content_type)

    runtime.start()
    return app
