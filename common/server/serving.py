"""The serving class: one scorer served, its model loading in the background, its protocols on
one request path, and the probes beside it. ``common.server.app`` only wires it into Flask.

The request path (``score``), for every protocol, in order: the deadline, the client and the
bearer token (``start_request``), the body read under its limit, parsed into a payload, the wait
for the model, the payload prepared into items, the items scored, the answer encoded; each stage
timed (``common.pipeline.metrics.Stages``). Errors answer in the request's protocol
(``error_response``)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from flask import Response, g, jsonify, request
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


def scoring_routes(protocols: Sequence[WireProtocol]) -> list[tuple[str, str, WireProtocol]]:
    """(endpoint, rule, protocol) of each scoring route, the core protocol first in ``protocols``:
    a service's protocol may answer on the core's routes (with a superset of its answer); the core
    keeps those no other protocol takes."""
    routes: list[tuple[str, str, WireProtocol]] = []
    taken: set[str] = set()
    for protocol in [*protocols[1:], protocols[0]]:
        for rule in protocol.routes:
            if rule not in taken:
                taken.add(rule)
                routes.append((f"{protocol.name}{rule}", rule, protocol))
    return routes


class ScoringService:
    """``scorer`` served with the core protocol and ``protocols``: the views and hooks of its app."""

    def __init__(self, scorer: Scorer, protocols: Sequence[type[WireProtocol]] = ()) -> None:
        self.scorer = scorer
        self.core = scorer.core
        self.name = scorer.name
        sections = settings_sections(self.name)
        self.deprecated = [message for section, cls in sections for message in deprecations(cls, section)]
        for message in self.deprecated:
            log.warning(message)
        self.own_settings = {section: describe(from_env(cls, section)) for section, cls in sections[1:]}
        self.trusted = trusted_networks(self.core.trusted_proxies)
        self.runtime = ScorerRuntime(scorer)
        self.limits = RequestLimits(self.core)
        self.protocols = [WireProtocol(scorer), *(protocol(scorer) for protocol in protocols)]
        self.routes = scoring_routes(self.protocols)
        self.protocol_of = {endpoint: protocol for endpoint, _, protocol in self.routes}

    def current_protocol(self) -> WireProtocol:
        """The protocol of the route requested; the core's on any other path."""
        return self.protocol_of.get(request.endpoint or "", self.protocols[0])

    def answer(self, obj: dict[str, Any], status: int = 200) -> Response:
        body, mimetype = self.current_protocol().encode(obj, request.content_type)
        return Response(body, status=status, mimetype=mimetype)

    # -- around every request ----------------------------------------------------------------

    def start_request(self) -> None:
        """One deadline per request, from when it arrived (the worker had it whole), for every
        stage it goes through; then the token."""
        g.started = time.perf_counter()
        g.scope = contextlib.ExitStack()
        arrived = request.environ.get(ARRIVED_KEY)
        g.scope.enter_context(request_deadline(Deadline(self.core.request_timeout_s, arrived)))
        connection = request.environ.get("gunicorn.socket")
        g.scope.enter_context(request_client(client_of(request.environ, self.trusted), connection))
        token = self.core.auth_token
        if token and request.method == "POST" and not bearer_token_matches(request.headers.get("Authorization"), token):
            raise Unauthorized("missing or wrong bearer token")

    def end_request(self, _: BaseException | None) -> None:
        if (scope := g.pop("scope", None)) is not None:
            scope.close()

    def count(self, response: Response) -> Response:
        if request.method == "POST":
            route = request.url_rule.rule if request.url_rule else "unmatched"
            metrics.REQUESTS.labels(self.name, route, str(response.status_code)).inc()
            latency = time.perf_counter() - g.get("started", time.perf_counter())
            metrics.LATENCY.labels(self.name, route).observe(latency)
            if response.status_code >= 400:
                metrics.ERRORS.labels(self.name, str(response.status_code)).inc()
        return response

    # -- errors, in the request's protocol ------------------------------------------------------

    def error_response(self, error: ScorerError) -> Response:
        status = self.current_protocol().status(error, request.content_type)
        if status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.path, status, error.message)
        response = self.answer({"error": error.message}, status)
        if isinstance(error, Overloaded) and error.retry_after_s is not None:
            response.headers["Retry-After"] = str(error.retry_after_s)
        return response

    def http_error(self, error: HTTPException) -> Response:
        return self.answer({"error": f"{error.name}: {error.description}"}, error.code or 500)

    def internal_error(self, error: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.path)
        fault = InternalError(f"internal error: {describe_error(error)}")
        return self.answer({"error": fault.message}, self.current_protocol().status(fault, request.content_type))

    # -- the one request path ----------------------------------------------------------------

    def score(self, protocol: WireProtocol) -> Response:
        """Body, payload, readiness, items, results, answer: the view of every scoring route."""
        query = list(request.args.items(multi=True))
        if query and not self.scorer.reads_query:
            # A trainer given a multi service's URL (``?ocr=0.5&pickscore=0.5``) would get
            # this scorer's score alone for the weighted sum it asked for.
            readers = " or ".join(f"the {s.name} service's (port {s.port})" for s in registry.joint_services())
            raise Unprocessable(
                f"the {self.name} service reads nothing in the URL's query (it has {quote(dict(query))}); "
                f"rewards and weights there are {readers}"
            )
        stages = metrics.Stages(self.name)
        arrived = request.environ.get(ARRIVED_KEY)
        if arrived is not None:  # the head whole -> a thread runs it: the body's bytes, the thread pool
            stages.observe("arrival", time.monotonic() - arrived)
        with stages("parse"):
            payload = protocol.parse(read_body(self.core.max_body_bytes), request.content_type)
        with stages("ready"):
            self.runtime.wait_ready()
        # The bytes its items hold (decoded images, model inputs) count from when they are
        # declared until its results are in.
        with self.limits.request():
            samples = self.limits.prepare(lambda: protocol.items(payload, query), stages)
            with stages("score"):  # the batch queue and the model
                results = samples.results(self.runtime.score(samples.items))
        with stages("answer"):
            return self.answer(protocol.answer(results))

    # -- probes --------------------------------------------------------------------------------

    def health(self) -> Response:
        return jsonify(status="ok", pid=os.getpid())

    def ready(self) -> tuple[Response, int]:
        if not self.runtime.ready:
            return jsonify(ready=False, reason=self.runtime.setup_error or "model is loading"), 503
        problem = self.scorer.ready_problem()
        if problem:
            return jsonify(ready=False, reason=problem), 503
        return jsonify(ready=True), 200

    def info(self) -> Response:
        return jsonify(
            service=self.name,
            version=__version__,
            scorer=type(self.scorer).__name__,
            device=self.runtime.device,
            gpu=os.environ.get(GPU_ENV),
            ready=self.runtime.ready,
            setup_error=self.runtime.setup_error,
            batching=self.runtime.batching(),
            settings=describe(self.core),
            service_settings=self.own_settings,
            deprecated_settings=self.deprecated,
            model=self.scorer.info(),
            pid=os.getpid(),
        )

    def metrics(self) -> Response:
        body, content_type = metrics.render()
        return Response(body, content_type=content_type)
