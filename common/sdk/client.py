"""Python client (sync and asyncio) and a CLI smoke test for the image scorers.

    python -m common.sdk.client http://node:18082 image.jpg 'a sign that says "open"'

The client speaks the pickle protocol by default (what flow_grpo / VeRL-Omni send) or JSON,
and retries by the one policy of every client (``common.sdk.retry``: 408, 429, 5xx, a dropped
connection or an attempt past its timeout, with doubling backoff, the same body each time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import pickle
import sys
import threading
import weakref
from collections.abc import Collection, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from common.sdk.retry import Answer, RetryPolicy, ScorerRequestError, post_async
from common.sdk.rewards import rewards_url
from common.sdk.wire import SafeUnpickler, WireFormat

T = TypeVar("T")

__all__ = ["AsyncScorerClient", "RetryPolicy", "ScorerClient", "ScorerRequestError", "settle"]


def build_body(
    images: Sequence[bytes], prompts: Sequence[str], metadata: dict[str, Any] | None, fmt: WireFormat
) -> tuple[bytes, dict[str, str]]:
    payload = {"images": list(images), "prompts": list(prompts), "metadata": metadata or {}}
    if fmt == "json":
        payload["images"] = [base64.b64encode(image).decode() for image in images]
        return json.dumps(payload).encode(), {"Content-Type": "application/json"}
    return pickle.dumps(payload), {"Content-Type": "application/octet-stream"}


def parse_answer(body: bytes, content_type: str) -> dict[str, Any]:
    """Decode an answer; the client trusts the server no more than the server trusts it."""
    if "json" in content_type:
        return json.loads(body)
    return SafeUnpickler(io.BytesIO(body)).load()


def error_message(body: bytes, content_type: str) -> str:
    """The message of an error answer: ours carry ``{"error": ...}``, a proxy's may be any page."""
    try:
        answer = parse_answer(body, content_type)
    except Exception:  # a balancer's HTML page, a truncated body: quote its start
        return body[:200].decode(errors="replace").strip() or "(empty body)"
    return str(answer.get("error", answer)) if isinstance(answer, dict) else str(answer)


def settle(answer: Answer) -> dict[str, Any]:
    """The parsed answer of a 200; ``ScorerRequestError`` for any other status (final, or the
    last of the retries)."""
    if answer.status == 200:
        return parse_answer(answer.body, answer.content_type)
    retried = f" (after {answer.attempts} attempts)" if answer.attempts > 1 else ""
    raise ScorerRequestError(answer.status, error_message(answer.body, answer.content_type) + retried)


class _Client:
    """What both clients hold: where to send, in which format, with which token and retries;
    for a ``multi`` service, which rewards with which ``weights`` (``rewards_url``)."""

    def __init__(
        self,
        url: str,
        fmt: WireFormat = "pickle",
        token: str | None = None,
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
        weights: Mapping[str, float] | None = None,
        optional: Collection[str] = (),
    ) -> None:
        self.url = rewards_url(url, weights, optional)
        self.fmt = fmt
        self.policy = RetryPolicy(retries, backoff, timeout)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}


class ScorerClient(_Client):
    """Blocking client: ``scores(images, prompts)`` returns one float per image. Its calls run
    the async client's ``post_async`` on an event loop of its own (one thread, one connection
    pool), so that both clients have one retry loop and an attempt is bounded whole by its
    timeout, however slowly a server sends (``requests``' timeout bounds each read only).
    ``close()`` (or ``with``) ends the loop; an unreferenced client closes itself."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="scorer-client", daemon=True).start()
        self._session = self._run(_open_session(self.auth))
        self._finalizer = weakref.finalize(self, _close, self._loop, self._session)

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """``common.sdk.retry.post_async``, the async client's, on this client's loop."""
        return self._run(post_async(self._session, self.url, body, self.policy, headers))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ScorerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(
        self, images: Sequence[bytes], prompts: Sequence[str], metadata: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return settle(self.post(*build_body(images, prompts, metadata, self.fmt)))

    def scores(
        self, images: Sequence[bytes], prompts: Sequence[str], metadata: dict[str, Any] | None = None
    ) -> list[float]:
        """The scores (of a ``multi`` service: the weighted sums; ``score`` has ``details``)."""
        return self.score(images, prompts, metadata)["scores"]


async def _open_session(headers: dict[str, str], connections: int = 100) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=connections))


def _close(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """A blocking client's end: its session closed on its loop, then the loop stopped."""
    asyncio.run_coroutine_threadsafe(session.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)


class AsyncScorerClient(_Client):
    """asyncio client, shaped like VeRL-Omni's: one request per image, gathered."""

    def __init__(self, url: str, connections: int = 256, **options: Any) -> None:
        super().__init__(url, **options)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncScorerClient:
        self._session = await _open_session(self.auth, self._connections)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def score(
        self, images: Sequence[bytes], prompts: Sequence[str], metadata: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        assert self._session is not None, "use 'async with AsyncScorerClient(...)'"
        body, headers = build_body(images, prompts, metadata, self.fmt)
        return settle(await post_async(self._session, self.url, body, self.policy, headers))

    async def score_each(
        self, images: Sequence[bytes], prompts: Sequence[str], metadata: dict[str, Any] | None = None
    ) -> list[float]:
        """One request per image, all in flight at once (VeRL-Omni's traffic shape)."""
        answers = await asyncio.gather(
            *(self.score([image], [prompt], metadata) for image, prompt in zip(images, prompts))
        )
        return [answer["scores"][0] for answer in answers]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m common.sdk.client", description="Score an image with a scorer service."
    )
    parser.add_argument("url", help="service URL, e.g. http://localhost:18082")
    parser.add_argument("image", type=Path, help="JPEG/PNG/WebP file")
    parser.add_argument("prompt", help="the prompt the image was generated from")
    parser.add_argument("--json", action="store_true", help="speak the JSON twin instead of pickle")
    parser.add_argument("--token", help="bearer token, when the service requires one")
    parser.add_argument("--metadata", default="{}", help="JSON dict of per-request options")
    parser.add_argument(
        "--weights", default=None, help='a multi service\'s rewards, JSON: {"ocr": 0.7, "pickscore": 0.3}'
    )
    args = parser.parse_args(argv)
    weights = json.loads(args.weights) if args.weights else None
    try:
        with ScorerClient(args.url, fmt="json" if args.json else "pickle", token=args.token, weights=weights) as client:
            score = client.scores([args.image.read_bytes()], [args.prompt], json.loads(args.metadata))[0]
    except (ScorerRequestError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(score)
    return 0


if __name__ == "__main__":
    sys.exit(main())
