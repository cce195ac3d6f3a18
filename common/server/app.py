"""The app factory: any ``Scorer`` becomes a Flask app. The serving class
(``common.server.serving.ScoringService``) holds the request path and the probes; this module
routes to it: its protocols' scoring routes (``common.server.protocols``) on that one path, and
``/health``, ``/ready``, ``/info``, ``/metrics``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from flask import Flask
from werkzeug.exceptions import HTTPException

from common.configuration.config import from_env
from common.configuration.settings import CoreSettings
from common.limits.errors import ScorerError
from common.pipeline.scorer import Scorer
from common.server.protocols import WireProtocol
from common.server.serving import ScoringService
from common.setup import registry


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
    service = ScoringService(scorer, protocols)

    app = Flask(f"scorer.{service.name}")
    app.before_request(service.start_request)
    app.teardown_request(service.end_request)
    app.after_request(service.count)
    app.register_error_handler(ScorerError, service.error_response)
    app.register_error_handler(HTTPException, service.http_error)
    app.register_error_handler(Exception, service.internal_error)
    for endpoint, rule, protocol in service.routes:
        view = functools.partial(service.score, protocol)
        app.add_url_rule(rule, endpoint=endpoint, view_func=view, methods=["POST"])
    app.add_url_rule("/health", view_func=service.health)
    app.add_url_rule("/ready", view_func=service.ready)
    app.add_url_rule("/info", view_func=service.info)
    app.add_url_rule("/metrics", view_func=service.metrics)

    service.runtime.start()
    return app
