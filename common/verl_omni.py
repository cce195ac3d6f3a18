"""A drop-in reward function for VeRL-Omni that sends whole videos (and images) to a scorer.

VeRL-Omni's stock ``http_scorer_client`` sends one image per sample: of a video, only its
first frame. Point a reward function at this module instead, with the same keys::

    +reward.reward_functions.hpsv3.path=pkg://common.verl_omni
    +reward.reward_functions.hpsv3.name=compute_score
    +reward.reward_functions.hpsv3.server_url=http://<node>:18085

(the repository on the trainer's ``PYTHONPATH``). For a ``multi`` service, the rewards and
weights go in the URL (``server_url=http://<node>:18100/?ocr=0.7&pickscore=0.3``) or in a
``weights`` keyword (``{ocr: 0.7, pickscore: 0.3}``, ``optional`` a list of those whose failure
only drops them). ``compute_score`` takes the stock client's
keyword arguments and retries as it does: each attempt given 120 s on one shared session, a
dropped connection, a timeout, 408, 429 or 5xx retried ``max_retries`` times after
``retry_backoff`` seconds, doubling; any other status, or an answer with an error or no score,
raises ``RuntimeError``. A sample is a tensor (torch or NumPy; uint8, or floats in [0, 1]) in
the layouts VeRL-Omni's rewards accept: one image CHW or HWC, or a video TCHW, THWC or CTHW
(a leading batch dimension of 1 is dropped). A video's frames 0, k, 2k, ... are sent (k:
the ``frame_interval`` keyword, else ``extra_info["frame_interval"]``, else 4, as VeRL-Omni's
HPSv3 reward) and the service scores each and answers their mean (ARCHITECTURE.md §5.1); a
single image, or a video of one frame, goes as an image, as the stock client sends it.

Imports only what the stock client needs (aiohttp, NumPy, Pillow; torch is optional) and
``common.wire``'s restricted unpickler for the answer (standard library).
"""

from __future__ import annotations

import asyncio
import io
import pickle
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from common.rewards import rewards_url
from common.wire import SafeUnpickler

DEFAULT_FRAME_INTERVAL = 4
ATTEMPT_TIMEOUT_S = 120


def frames_of(sample: Any) -> np.ndarray:
    """A sample -> uint8 RGB frames (T, H, W, 3), T = 1 for an image; channels found as VeRL-Omni's
    rewards find them: last when the last dimension is 3, else second, else first."""
    if hasattr(sample, "detach"):  # a torch tensor, without importing torch
        sample = sample.detach().cpu()
        sample = sample.float().numpy() if sample.is_floating_point() else sample.numpy()
    array = np.asarray(sample)
    while array.ndim == 5 and array.shape[0] == 1:
        array = array[0]
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4:
        raise ValueError(f"expected an image (CHW/HWC) or a video (TCHW/THWC/CTHW), got shape {array.shape}")
    if array.shape[-1] == 3:  # THWC
        pass
    elif array.shape[1] == 3:  # TCHW
        array = array.transpose(0, 2, 3, 1)
    elif array.shape[0] == 3:  # CTHW
        array = array.transpose(1, 2, 3, 0)
    else:
        raise ValueError(f"no RGB channel dimension (of 3) in shape {array.shape}")
    if array.dtype != np.uint8:
        array = np.clip(np.rint(array.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    return array


def encode_frame(frame: np.ndarray, image_format: str = "JPEG") -> bytes:
    """One HWC uint8 frame -> JPEG (the stock client's format; Pillow's default quality) or PNG."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buffer, format=image_format)
    return buffer.getvalue()


def request_body(
    sample: Any,
    prompt: str,
    frame_interval: int,
    image_format: str = "JPEG",
    metadata: dict[str, Any] | None = None,
) -> bytes:
    """The pickled request of one sample: an image, or a video of its chosen frames."""
    if isinstance(frame_interval, bool) or not isinstance(frame_interval, int) or frame_interval < 1:
        raise ValueError(f"frame_interval must be a whole number from 1, got {frame_interval!r}")
    metadata = dict(metadata or {})
    frames = frames_of(sample)
    if len(frames) == 1:
        return pickle.dumps(
            {"images": [encode_frame(frames[0], image_format)], "prompts": [prompt], "metadata": metadata}
        )
    # Only the chosen frames travel; the service then scores every one it gets (frame_interval 1).
    chosen = [encode_frame(frame, image_format) for frame in frames[::frame_interval]]
    return pickle.dumps({"videos": [chosen], "prompts": [prompt], "metadata": {**metadata, "frame_interval": 1}})


def _load(body: bytes) -> Any:
    """A pickled answer, built by the restricted unpickler (plain data only)."""
    return SafeUnpickler(io.BytesIO(body)).load()


def _error_detail(body: bytes) -> str:
    try:
        answer = _load(body)
    except Exception:  # not a pickle: the body as text
        return body.decode("utf-8", errors="replace")
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])
    return body.decode("utf-8", errors="replace")


async def compute_score(
    solution_image: Any,
    ground_truth: str,
    server_url: str,
    max_retries: int = 2,
    retry_backoff: float = 0.5,
    frame_interval: int | None = None,
    extra_info: dict[str, Any] | None = None,
    image_format: str = "JPEG",
    metadata: dict[str, Any] | None = None,
    weights: dict[str, float] | None = None,
    optional: list[str] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """Score one sample (image or video) and its prompt on the scorer at ``server_url``;
    returns ``{"score": float}``, as VeRL-Omni's ``http_scorer_client.compute_score``.
    ``metadata`` goes with the request (the stock client sends none), e.g. OCR options or
    ``{"video_rule": "video_ocr"}``; ``weights`` (and ``optional``) go in the URL's query, for
    a ``multi`` service."""
    if weights:
        server_url = rewards_url(server_url, weights, optional or ())
    if max_retries < 0:
        raise ValueError(f"max_retries must be non-negative, got {max_retries}")
    if retry_backoff < 0:
        raise ValueError(f"retry_backoff must be non-negative, got {retry_backoff}")
    if frame_interval is None:
        frame_interval = (extra_info or {}).get("frame_interval", DEFAULT_FRAME_INTERVAL)
    loop = asyncio.get_running_loop()
    body = await loop.run_in_executor(
        None, request_body, solution_image, ground_truth, frame_interval, image_format, metadata
    )

    session: aiohttp.ClientSession | None = getattr(compute_score, "_session", None)
    if session is None or session.closed:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT_S))
        compute_score._session = session  # type: ignore[attr-defined]
    attempts = max_retries + 1
    last_error: BaseException | None = None
    for attempt in range(attempts):
        try:
            async with session.post(server_url, data=body) as response:
                answer_bytes = await response.read()
                if response.status == 200:
                    answer = _load(answer_bytes)
                    break
                error = RuntimeError(f"Scorer server returned HTTP {response.status}: {_error_detail(answer_bytes)}")
                if not (response.status in (408, 429) or 500 <= response.status < 600):
                    raise error
                last_error = error
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            last_error = exc
        if attempt < max_retries:
            await asyncio.sleep(retry_backoff * 2**attempt)
    else:
        raise RuntimeError(f"HTTP scoring failed after {attempts} attempts: {last_error}") from last_error

    if "error" in answer:
        raise RuntimeError(f"Scorer server error: {answer['error']}")
    scores = answer.get("scores")
    if not scores:
        raise RuntimeError("Scorer server returned no scores")
    return {"score": float(scores[0])}
