"""A small OpenAI-compatible engine for tests that need the judge's engine to answer chosen
replies at once (the real one, ``testing/judge_engine.py``, runs ``transformers serve``): its
``/v1/models`` lists one model and each chat completion's reply is ``reply(prompt_text)``, the
text parts of the request's last message joined."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "stand-in"


@contextlib.contextmanager
def chat_engine(reply: Callable[[str], str]) -> Iterator[str]:
    """The engine running on a free port; yields its base URL (``http://127.0.0.1:PORT``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content = body["messages"][-1]["content"]
            text = "\n".join(part["text"] for part in content if part.get("type") == "text")
            message = {"role": "assistant", "content": reply(text)}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            self.answer({"object": "chat.completion", "model": MODEL, "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop"}], "usage": usage})  # fmt: skip

        def answer(self, document: dict[str, Any]) -> None:
            data = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
