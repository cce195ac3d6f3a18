"""Core settings shared by every service (``SCORER_*``): the one typed path from the environment
to the app and to ``gunicorn.conf.py`` (standard library only, since the gunicorn master reads it).
Each field is declared once (``common.configuration.config.setting``): its help, flag and default are what
``run.sh``, ``/info`` and docs/settings.md show."""

from __future__ import annotations

from dataclasses import dataclass

from common.configuration.config import setting
from common.limits.clients import trusted_networks

ONE_PER_CORE = "one per CPU core"


@dataclass(frozen=True)
class CoreSettings:
    """Limits, batching and serving settings; each is ``SCORER_<FIELD>`` in the environment."""

    service: str = setting("ocr", "which service gunicorn serves (an entry of `common/setup/registry.py`)")
    # Request limits (docs/ARCHITECTURE.md §6): each breach is a clear 4xx.
    max_body_bytes: int = setting(256 * 1024 * 1024, "request body limit (413)")
    max_items: int = setting(
        1024, "images to score per request: an image request's images, a video request's chosen frames (413)"
    )
    # A frame not chosen is never decoded.
    max_frames: int = setting(1024, "frames per video as sent, chosen or not (413)")
    max_pixels: int = setting(4096 * 4096, "pixels per image, checked before decoding (413)")
    # An image sent once and referenced many times through the pickle memo counts each time.
    max_request_pixels: int = setting(
        100_000_000,
        "pixels of all images of a request together, from the headers before decoding, and of each scorer's model "
        "input after its own resize (OCR's detector input: a 50x1 PNG is read at 2944x736; CLIP's shortest edge); "
        "an image referenced several times counts each time, though each scorer prepares and reads it once (413)",
    )
    # OCR upscales a thin image's short side, so a 200x1 strip would become a 6016x1504 detector input.
    max_aspect_ratio: float = setting(50.0, "longest over shortest side of an image (422)")
    max_prompt_chars: int = setting(8192, "characters per prompt (413)")
    # As many as a pickle may hold (common/sdk/wire.py), ~75 MB and ~0.5 s to build.
    max_json_values: int = setting(
        1_000_000, "values (keys included) of a JSON-twin body, counted before it is parsed (413)"
    )
    # Real progressive JPEGs have ~10 scans (libjpeg-turbo sets no limit); Pillow spends
    # microseconds on each PNG chunk, even an empty one.
    max_jpeg_scans: int = setting(
        100,
        "scans of a JPEG, counted from its bytes before decoding: a progressive JPEG is decoded once per scan (413)",
    )
    max_png_chunks: int = setting(
        100_000, "chunks of all PNGs of a request, each reference counted, walked before Pillow reads them (413)"
    )
    # Dynamic batcher; None means "the scorer's own default".
    max_batch: int | None = setting(
        None,
        "items per model call, gathered across requests (OCR's detection and recognition calls take "
        "`SCORER_OCR_DET_BATCH` and `SCORER_OCR_REC_BATCH`, GenEval's colour calls `SCORER_GENEVAL_COLOR_BATCH`)",
        scorer_default="max_batch",
    )
    max_wait_ms: float | None = setting(
        None, "how long the first item of a batch waits for others", scorer_default="max_wait_ms"
    )
    max_queue: int = setting(
        4096,
        "items waiting for a model call per stage; beyond it a request waits for room, in deadline order, until its "
        "deadline (then 503, a pickle body's 500; 413 for a request that alone has more)",
    )
    # A 16 KB white 2000x2000 PNG is a 56.5 MB OCR detector input.
    max_work_bytes: int = setting(
        4 * 2**30,
        "bytes of request work a worker holds at once (decoded images, model inputs, items waiting for a model "
        "call), estimated from the image headers before any is made; a request that would take it past this waits "
        "for room, earliest deadline first, until its deadline (then 503, a pickle body's 500; 413 at once for a "
        "request that alone needs more)",
        renamed_from="max_queue_bytes",
    )
    ready_wait_s: float = setting(
        60.0, "a request arriving while the model loads waits this long, then 503 (a pickle body's 500)"
    )
    # Trainers time out at 120 s.
    request_timeout_s: float = setting(
        110.0,
        "a request's deadline from its arrival, across all its batched stages; one that cannot be answered by then "
        "gets 503, a pickle body's 500 (a full queue or busy model is waited for until then, never refused early)",
    )
    head_timeout_s: float = setting(
        10.0, "a request's head must arrive within this (of the connection, or of its first byte), else 408"
    )
    body_timeout_s: float = setting(60.0, "its body within this after the head, else 408")
    decode_threads: int | None = setting(
        None, "requests decoding and preprocessing at once in a worker", shown_default=ONE_PER_CORE
    )
    auth_token: str | None = setting(
        None,
        "when set, `POST`s (and any request with a body) need `Authorization: Bearer <token>` (scheme "
        "case-insensitive; checked when the head has arrived, before the body is read)",
        secret=True,
    )
    # Behind nginx (deploy/) the peer is the proxy: the address it forwards names the client.
    trusted_proxies: str = setting(
        "",
        "addresses or networks of proxies whose `X-Forwarded-For` names the client (its last address); from any other "
        "peer the header is ignored and the peer is the client",
        check=trusted_networks,
    )
    device: str = setting("auto", "`auto` (the worker's GPU, else CPU), `cpu`, `cuda`")
    # gunicorn (gunicorn.conf.py).
    port: int | None = setting(None, "the port to listen on", flag=True, shown_default="the service's own")
    bind: str | None = setting(None, "the address to listen on (overrides the port)", shown_default="`0.0.0.0:PORT`")
    workers: int | None = setting(
        None, "worker processes", flag=True, shown_default="one per visible GPU for a GPU service, else 1"
    )
    threads: int | None = setting(
        None,
        "request threads per worker (they wait for batches or run slots; decoding runs there)",
        shown_default="the service's own: 128; `code` 1024 (a request waits for its run slots on its thread)",
    )
    # Each idle connection costs a descriptor and ~2 KB until its head deadline.
    worker_connections: int = setting(
        32768,
        "connections a worker holds at once, idle ones included (at most what the file descriptor limit leaves "
        "room for; a killed worker loses those)",
    )
    worker_timeout: int = setting(120, "gunicorn's heartbeat timeout")
    graceful_timeout: int = setting(30, "seconds in-flight requests get to finish on SIGTERM")
    log_level: str = setting("info", "gunicorn's log level")
    access_log: str | None = setting(None, "an access log path (`-` for stdout)")
