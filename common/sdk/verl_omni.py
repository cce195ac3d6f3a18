"""A drop-in reward function for VeRL-Omni that sends whole videos (and images) to a scorer.

VeRL-Omni's stock ``http_scorer_client`` sends one image per sample: of a video, only its
first frame. Point a reward function at this module instead, with the same keys::

    +reward.reward_functions.hpsv3.path=pkg://common.sdk.verl_omni
    +reward.reward_functions.hpsv3.name=compute_score
    +reward.reward_functions.hpsv3.server_url=http://<node>:18085

(the repository on the trainer's ``PYTHONPATH``). For a ``multi`` service, the rewards and
weights go in the URL (``server_url=http://<node>:18100/?ocr=0.7&pickscore=0.3``) or in a
``weights`` keyword (``{ocr: 0.7, pickscore: 0.3}``, ``optional`` a list of those whose failure
only drops them). ``compute_score`` takes the stock client's
keyword arguments and retries by the one policy of every client (``common.sdk.retry``): each
attempt given 120 s on one shared session, a dropped connection, a timeout, 408, 429 or 5xx
retried ``max_retries`` times after ``retry_backoff`` seconds, doubling, the same body each
time; any other status, or an answer with an error or no score, raises ``RuntimeError``
(``ScorerRequestError`` for a status). The server's URL may name the route (``.../score``).
Reward-config fields VeRL-Omni hands over as OmegaConf containers (``metadata={ocr: {target:
all}}``) are sent as the plain dicts and lists they hold.

A sample is a tensor (torch or NumPy; uint8, or floats in [0, 1]) laid out as VeRL-Omni's own
rewards read it (``verl_omni/utils/reward_score/hpsv3_reward.py``, ``_extract_frames``): an
image CHW or HWC; a video CTHW (channels, then frames: the rollout's ``[C, F, H, W]``) or,
when its last dimension is 3, THWC; a leading batch dimension of 1 is dropped. A shape that
two of those layouts fit (a 3-frame THWC video is also a CTHW one 3 pixels wide) is refused
unless the ``layout`` keyword names one (``"CTHW"``, ``"THWC"``, ``"TCHW"``, ``"CHW"``,
``"HWC"``; TCHW, which VeRL-Omni's rewards do not read, is taken only when named). A video's
frames 0, k, 2k, ... are sent (k: the ``frame_interval`` keyword, else
``extra_info["frame_interval"]``, else 4, as VeRL-Omni's HPSv3 reward) and the service scores
each and answers their mean (ARCHITECTURE.md §5.1); a single image, or a video of one frame,
goes as an image, as the stock client sends it.

Imports only what the stock client needs (aiohttp, NumPy, Pillow; torch and OmegaConf are
optional) and ``common.sdk.wire``'s restricted unpickler for the answer (standard library).
"""

from __future__ import annotations

import asyncio
import io
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from common.sdk.retry import RetryPolicy, ScorerRequestError, post_async
from common.sdk.rewards import rewards_url
from common.sdk.wire import SafeUnpickler

DEFAULT_FRAME_INTERVAL = 4
# Each layout's axes, in the order frames, height, width, channels takes them (None: an image).
LAYOUTS: dict[str, tuple[int, ...]] = {
    "HWC": (0, 1, 2),
    "CHW": (1, 2, 0),
    "THWC": (0, 1, 2, 3),
    "CTHW": (1, 2, 3, 0),
    "TCHW": (0, 2, 3, 1),
}
# The layouts read from a shape alone, as VeRL-Omni's rewards read them: channels last when the
# last dimension is 3, else first.
INFERRED = {3: ("HWC", "CHW"), 4: ("THWC", "CTHW")}


def plain(value: Any) -> Any:
    """``value`` with every mapping and sequence in it (an OmegaConf ``DictConfig`` or
    ``ListConfig`` among them) as a plain dict or list, which the request's pickle carries."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return [plain(item) for item in value]
    return value


def layout_of(shape: tuple[int, ...], layout: str | None) -> str:
    """The layout of a sample of ``shape`` (a batch of one dropped): ``layout`` when given (it
    must fit), else the one of VeRL-Omni's that fits; ``ValueError`` when none or both do."""
    if layout is not None:
        axes = LAYOUTS.get(layout)
        if axes is None or len(axes) != len(shape) or shape[axes[-1]] != 3:
            raise ValueError(f"layout={layout!r} does not fit a sample of shape {shape}; one of {sorted(LAYOUTS)}")
        return layout
    fitting = [name for name in INFERRED.get(len(shape), ()) if shape[LAYOUTS[name][-1]] == 3]
    if len(fitting) != 1:
        found = "both " + " and ".join(fitting) if fitting else "no RGB channel dimension (of 3) first or last"
        raise ValueError(
            f"a sample of shape {shape} fits {found}: name its layout (layout='CTHW', 'THWC', 'TCHW', 'CHW' or "
            "'HWC'); VeRL-Omni's rewards read an image CHW or HWC and a video CTHW or THWC"
        )
    return fitting[0]


def frames_of(sample: Any, layout: str | None = None) -> np.ndarray:
    """A sample -> uint8 RGB frames (T, H, W, 3), T = 1 for an image (``layout_of``)."""
    if hasattr(sample, "detach"):  # a torch tensor, without importing torch
        sample = sample.detach().cpu()
        sample = sample.float().numpy() if sample.is_floating_point() else sample.numpy()
    array = np.asarray(sample)
    while array.ndim > (len(LAYOUTS[layout]) if layout in LAYOUTS else 3) and array.shape[0] == 1:
        array = array[0]  # a batch of one
    if array.ndim not in (3, 4):
        raise ValueError(f"expected an image (CHW/HWC) or a video (CTHW/THWC), got shape {array.shape}")
    array = array.transpose(LAYOUTS[layout_of(array.shape, layout)])
    if array.ndim == 3:
        array = array[None]
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
    metadata: Mapping[str, Any] | None = None,
    layout: str | None = None,
) -> bytes:
    """The pickled request of one sample: an image, or a video of its chosen frames."""
    if isinstance(frame_interval, bool) or not isinstance(frame_interval, int) or frame_interval < 1:
        raise ValueError(f"frame_interval must be a whole number from 1, got {frame_interval!r}")
    metadata = plain(metadata or {})
    frames = frames_of(sample, layout)
    if len(frames) == 1:
        return pickle.dumps(
            {"images": [encode_frame(frames[0], image_format)], "prompts": [prompt], "metadata": metadata}
        )
    # Only the chosen frames travel; the service then scores every one it gets (frame_interval 1).
    chosen = [encode_frame(frame, image_format) for frame in frames[::frame_interval]]
    return pickle.dumps({"videos": [chosen], "prompts": [prompt], "metadata": {**metadata, "frame_interval": 1}})


async def compute_score(
    solution_image: Any,
    ground_truth: str,
    server_url: str,
    max_retries: int = 2,
    retry_backoff: float = 0.5,
    frame_interval: int | None = None,
    extra_info: Mapping[str, Any] | None = None,
    image_format: str = "JPEG",
    metadata: Mapping[str, Any] | None = None,
    weights: Mapping[str, float] | None = None,
    optional: Sequence[str] | None = None,
    layout: str | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """Score one sample (image or video) and its prompt on the scorer at ``server_url``;
    returns ``{"score": float}``, as VeRL-Omni's ``http_scorer_client.compute_score``.
    ``metadata`` goes with the request (the stock client sends none), e.g. OCR options or
    ``{"video_rule": "video_ocr"}``; ``weights`` (and ``optional``) go in the URL's query, for
    a ``multi`` service; ``layout`` names the sample's layout where its shape does not tell."""
    weights, optional, extra_info = plain(weights), plain(optional), plain(extra_info or {})
    if weights:
        server_url = rewards_url(server_url, weights, optional or ())
    policy = RetryPolicy(max_retries, retry_backoff)
    if frame_interval is None:
        frame_interval = extra_info.get("frame_interval", DEFAULT_FRAME_INTERVAL)
    loop = asyncio.get_running_loop()
    body = await loop.run_in_executor(
        None, request_body, solution_image, ground_truth, frame_interval, image_format, metadata, layout
    )

    session: aiohttp.ClientSession | None = getattr(compute_score, "_session", None)
    if session is None or session.closed:
        session = aiohttp.ClientSession()
        compute_score._session = session  # type: ignore[attr-defined]
    answer = await post_async(session, server_url, body, policy)
    if answer.status != 200:
        retried = f" (after {answer.attempts} attempts)" if answer.attempts > 1 else ""
        raise ScorerRequestError(answer.status, _error_detail(answer.body) + retried)
    parsed = _load(answer.body)
    if "error" in parsed:
        raise RuntimeError(f"Scorer server error: {parsed['error']}")
    scores = parsed.get("scores")
    if not scores:
        raise RuntimeError("Scorer server returned no scores")
    return {"score": float(scores[0])}


def _load(body: bytes) -> Any:
    """A pickled answer, built by the restricted unpickler (plain data only)."""
    return SafeUnpickler(io.BytesIO(body)).load()


def _error_detail(body: bytes) -> str:
    try:
        answer = _load(body)
    except Exception:  # not a pickle: the body as text
        return body[:200].decode("utf-8", errors="replace")
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])
    return body[:200].decode("utf-8", errors="replace")
