"""Core settings shared by every service (``SCORER_*``): the one typed path from the environment
to the app and to ``gunicorn.conf.py`` (standard library only, since the gunicorn master reads it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoreSettings:
    """Limits, batching and serving settings; each is ``SCORER_<FIELD>`` in the environment."""

    # Which entry of ``common.registry.SERVICES`` to serve.
    service: str = "ocr"
    # Request limits (docs/ARCHITECTURE.md §6): each breach is a clear 4xx.
    max_body_bytes: int = 256 * 1024 * 1024
    # Images to score per request: an image request's images, a video request's chosen frames.
    max_items: int = 1024
    # Frames per video as sent, chosen or not (a frame not chosen is never decoded).
    max_frames: int = 1024
    max_pixels: int = 4096 * 4096
    # Pixels of all images of one request, summed from their headers before any is decoded; an
    # image sent once and referenced many times through the pickle memo counts each time.
    max_request_pixels: int = 100_000_000
    # Longest side over shortest side (422): OCR upscales a thin image's short side, so a 200x1
    # strip would become a 6016x1504 detector input.
    max_aspect_ratio: float = 50.0
    max_prompt_chars: int = 8192
    # Values (dict keys included) of a JSON-twin body, counted before it is parsed (413): as many
    # as a pickle may hold (common/wire.py), ~75 MB and ~0.5 s to build.
    max_json_values: int = 1_000_000
    # Scans per JPEG: a progressive JPEG is decoded once per scan over the whole image (real ones
    # have ~10; libjpeg-turbo sets no limit). PNG chunks of all images of a request, each
    # reference counted: Pillow spends microseconds on each, even an empty one.
    max_jpeg_scans: int = 100
    max_png_chunks: int = 100_000
    # Dynamic batcher; None means "the scorer's own default".
    max_batch: int | None = None
    max_wait_ms: float | None = None
    max_queue: int = 4096
    # Bytes of request work a worker holds at once, estimated from the image headers before any
    # is made: decoded images, model inputs and items waiting for a model call (a 16 KB white
    # 2000x2000 PNG is a 56.5 MB OCR detector input). Beyond it 503 (413 for a request that alone
    # needs more).
    max_queue_bytes: int = 4 * 2**30
    # How long a scoring request waits for a model that is still loading, then 503.
    ready_wait_s: float = 60.0
    # A request's deadline, from its arrival, across all its batched stages: a request that cannot
    # be answered by then gets 503, early when its stage's estimated wait says so (trainers time
    # out at 120 s).
    request_timeout_s: float = 110.0
    # A request's head must arrive within this many seconds (of the connection, or of its first
    # byte on a kept-alive one), its body within the next; else 408 and the connection closed.
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # Requests decoding and preprocessing at once; None: one per CPU core.
    decode_threads: int | None = None
    # Optional bearer token, checked before the body is read.
    auth_token: str | None = None
    # "auto" picks cuda when a GPU is visible, else cpu.
    device: str = "auto"
    # gunicorn (gunicorn.conf.py). Port: the service's own (common/registry.py) unless set; bind
    # overrides both. Workers: one per visible GPU for a GPU service, else 1.
    port: int | None = None
    bind: str | None = None
    workers: int | None = None
    # Request threads per worker: they wait for batches, and decoding runs on them.
    threads: int = 128
    # Connections one worker holds, idle ones included (each costs a descriptor and ~2 KB until
    # its head deadline); at most the file descriptor limit leaves room for (gunicorn.conf.py).
    worker_connections: int = 32768
    # gunicorn's heartbeat timeout; seconds in-flight requests get to finish on SIGTERM.
    worker_timeout: int = 120
    graceful_timeout: int = 30
    log_level: str = "info"
    # An access log path ("-" for stdout); none by default.
    access_log: str | None = None


@dataclass(frozen=True)
class MultiSettings:
    """``SCORER_MULTI_*``: the rewards the ``multi`` service serves together (services/multi/scorer.py)."""

    # The image scorers one worker loads, comma-separated (``run.sh multi --rewards ocr,pickscore``),
    # each with its own service's settings; none listed: the service does not start.
    rewards: str = ""
