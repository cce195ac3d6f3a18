"""The routes of SandboxFusion's API on the code service's request path (``common.server.protocols``).

``POST /run_code`` takes SandboxFusion's JSON request and answers its ``RunCodeResponse``
(``api``). A run the sandbox could not make, an overloaded node and a node not ready yet are
a 504: the one status verl's client retries (``call_sandbox_api``); any other it scores 0.
``POST /run_jupyter`` is a 404 that says it is not served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.limits.clients import current_client
from common.limits.errors import NotReady, Overloaded, ScorerError, Unprocessable
from common.pipeline.scorer import Query, Result
from common.sdk.wire import decode_body, encode_body
from common.server.protocols import WireProtocol
from services.code.protocols.sandbox_fusion import api
from services.code.scorer import CodeScorer

# Statuses verl's client retries instead of scoring the test case 0.
RETRIED = 504


class NotServed(ScorerError):
    status = 404


class RunCodeProtocol(WireProtocol):
    """SandboxFusion's ``POST /run_code`` (verl's ``sandbox_fusion.url`` and its
    ``SandboxFusionTool``, ScaleBox and other clients of that API)."""

    name = "sandbox_fusion"
    routes = ("/run_code",)
    scorer: CodeScorer

    def parse(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        payload = decode_body(body, "json", self.json_cap)
        if not isinstance(payload, dict):
            raise Unprocessable("the body must be a JSON object (SandboxFusion's RunCodeRequest)")
        return payload

    def items(self, payload: dict[str, Any], query: Query = ()) -> list[Any]:
        return [api.parse(payload, self.scorer.settings, current_client())]

    def answer(self, results: Sequence[Result]) -> dict[str, Any]:
        [ran] = results
        assert isinstance(ran, api.Ran), "a /run_code request is answered by a run"
        return ran.answer

    def encode(self, answer: dict[str, Any], content_type: str | None) -> tuple[bytes, str]:
        return encode_body(answer, "json")

    def status(self, error: ScorerError, content_type: str | None) -> int:
        return RETRIED if isinstance(error, Overloaded | NotReady) else error.status


class RunJupyterProtocol(RunCodeProtocol):
    """SandboxFusion's ``POST /run_jupyter``: not served (a 404 that says so)."""

    name = "sandbox_fusion_jupyter"
    routes = ("/run_jupyter",)

    def parse(self, body: bytes, content_type: str | None) -> dict[str, Any]:
        raise NotServed("POST /run_jupyter is not served by this node: only SandboxFusion's /run_code is")
