"""flow_grpo's JPEG rewards as services (``jpeg_compressibility``, ``jpeg_incompressibility``) and
in ``multi``, against running servers: equal to an independent re-statement of flow_grpo's rule
(``testing/jpeg_reference.py``) on the same decoded pixels, and, where
``SCORER_TEST_FLOW_GRPO_REWARDS`` names a copy of flow_grpo's ``flow_grpo/rewards.py`` (not
shipped), to flow_grpo's own functions on the pixels a PNG carries; then the attacks: tiny
images, images at the pixel cap, one image referenced many times, every mode a file can carry.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from testing import fetched
from testing import jpeg_reference as reference
from testing.images import encode
from testing.server import Server, cpu_seconds, gunicorn_server
from testing.timing import within

FLOW_GRPO_REWARDS = os.environ.get("SCORER_TEST_FLOW_GRPO_REWARDS")
needs_flow_grpo = pytest.mark.skipif(
    not FLOW_GRPO_REWARDS, reason="missing: SCORER_TEST_FLOW_GRPO_REWARDS names no copy of flow_grpo/rewards.py"
)
RULES = {"jpeg_compressibility": reference.compressibility, "jpeg_incompressibility": reference.incompressibility}
CAP = 4096 * 4096  # SCORER_MAX_PIXELS's default


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("logs")
    with (
        gunicorn_server("jpeg_compressibility", log_dir=logs) as compressibility,
        gunicorn_server("jpeg_incompressibility", log_dir=logs) as incompressibility,
    ):
        yield {"jpeg_compressibility": compressibility, "jpeg_incompressibility": incompressibility}


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"SCORER_MULTI_REWARDS": "jpeg_compressibility,jpeg_incompressibility"}
    with gunicorn_server("multi", env=env, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server


def post(url: str, images: list[bytes], metadata: dict[str, Any] | None = None) -> requests.Response:
    body = {"images": images, "prompts": [""] * len(images), "metadata": metadata or {}}
    return requests.post(url, data=pickle.dumps(body), timeout=120)


def scores(url: str, images: list[bytes], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    response = post(url, images, metadata)
    assert response.status_code == 200, response.content[:300]
    return pickle.loads(response.content)


def png(pixels: np.ndarray) -> bytes:
    return encode(Image.fromarray(pixels), "PNG", compress_level=1)


def sample_pixels() -> list[np.ndarray]:
    """Noise, a smooth gradient, a flat colour and a thin strip: sizes from tiny to a few hundred kB."""
    rng = np.random.default_rng(41)
    ramp = np.linspace(0, 255, 320).astype(np.uint8)
    return [
        rng.integers(0, 256, (256, 192, 3), dtype=np.uint8),
        np.dstack([np.tile(ramp, (240, 1)), np.tile(ramp[::-1], (240, 1)), np.full((240, 320), 90, np.uint8)]),
        np.full((64, 64, 3), (200, 30, 120), np.uint8),
        rng.integers(0, 256, (5, 200, 3), dtype=np.uint8),
    ]


@pytest.mark.parametrize("rule", list(RULES))
def test_a_png_scores_flow_grpos_rule_exactly(servers: dict[str, Server], rule: str) -> None:
    pixels = sample_pixels()
    answer = scores(servers[rule].url, [png(p) for p in pixels])
    assert answer["scores"] == answer["outputs"] == [RULES[rule](p) for p in pixels]


@needs_flow_grpo
def test_flow_grpos_own_functions_give_the_services_numbers(servers: dict[str, Server], multi: Server) -> None:
    """flow_grpo's ``jpeg_compressibility``, ``jpeg_incompressibility`` and ``multi_score``, on
    the float NCHW tensor its trainer passes and on uint8 NHWC arrays, equal the services' scores
    of PNGs of the same pixels, to the last bit."""
    flow_grpo = fetched.load_module(Path(str(FLOW_GRPO_REWARDS)), "flow_grpo_rewards")
    batch = torch.rand(4, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    pixels = reference.pixels_of(batch.numpy())
    pngs = [png(p) for p in pixels]
    prompts = [""] * len(pngs)
    for rule in RULES:
        ours = scores(servers[rule].url, pngs)["scores"]
        theirs, _ = getattr(flow_grpo, rule)()(batch, prompts, {})
        from_arrays, _ = getattr(flow_grpo, rule)()(pixels, prompts, {})
        assert ours == theirs.tolist() == from_arrays.tolist()
    details, _ = flow_grpo.multi_score("cpu", {"jpeg_compressibility": 0.7})(batch, prompts, {})
    combined = scores(multi.url, pngs, {"rewards": {"jpeg_compressibility": 0.7}})
    assert combined["details"]["jpeg_compressibility"] == details["jpeg_compressibility"].tolist()
    assert combined["scores"] == details["avg"]


def test_a_jpeg_scores_its_decoded_pixels(servers: dict[str, Server]) -> None:
    """A JPEG input is decoded, then saved again at quality 95: its score is that of its decoded
    pixels, not of the pixels it was made from (JPEG's loss changes them)."""
    original = sample_pixels()[0]
    sent = encode(Image.fromarray(original), "JPEG", quality=80)
    decoded = np.asarray(Image.open(io.BytesIO(sent)).convert("RGB"))
    for rule, score in RULES.items():
        (value,) = scores(servers[rule].url, [sent])["scores"]
        assert value == score(decoded) != score(original)


def test_a_comment_in_the_file_is_not_counted(servers: dict[str, Server]) -> None:
    """Pillow writes an image's own comment into the JPEG it saves: a JPEG input carrying a
    60,000-byte comment scored 65.3 kB where its pixels make 5.3 when the decoded image itself
    was saved. The score is its pixels' alone, as flow_grpo's ``Image.fromarray`` image has none."""
    pixels = np.random.default_rng(7).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    plain = encode(Image.fromarray(pixels), "JPEG", quality=90)
    commented = encode(Image.fromarray(pixels), "JPEG", quality=90, comment=b"x" * 60_000)
    decoded = np.asarray(Image.open(io.BytesIO(plain)))
    for rule, score in RULES.items():
        assert scores(servers[rule].url, [commented, plain])["scores"] == [score(decoded)] * 2


def test_a_one_pixel_image(servers: dict[str, Server]) -> None:
    pixel = np.array([[[12, 200, 99]]], np.uint8)
    for rule, score in RULES.items():
        assert scores(servers[rule].url, [png(pixel)])["scores"] == [score(pixel)]


@pytest.mark.timing
def test_an_image_at_the_pixel_cap_is_scored_and_one_past_it_refused(servers: dict[str, Server]) -> None:
    """4096 x 4096 (``SCORER_MAX_PIXELS``) is scored, equal to the rule, for about half a second
    of the worker's CPU on a quiet machine (its CPU time, not the wall clock: the bound holds on
    a loaded machine); one row more is a 413 before any pixel is decoded."""
    ramp = np.linspace(0, 255, 4096).astype(np.uint8)
    flat = np.full((4096, 4096), 7, np.uint8)
    pixels = np.dstack([np.tile(ramp, (4096, 1)), np.tile(ramp[:, None], (1, 4096)), flat])
    at_cap, past_cap = png(pixels), encode(Image.new("RGB", (4096, 4097)), "PNG")
    server = servers["jpeg_compressibility"]
    (pid,) = server.worker_pids()
    before = cpu_seconds(pid)
    answer = scores(server.url, [at_cap])
    assert cpu_seconds(pid) - before < within(2.0)
    assert answer["scores"] == [reference.compressibility(pixels)]
    refused = post(server.url, [past_cap])
    assert refused.status_code == 413 and b"pixels" in refused.content, refused.content[:300]


def test_one_image_referenced_many_times_is_encoded_once(servers: dict[str, Server]) -> None:
    """A 2048 x 2048 noise PNG referenced 23 times through the pickle memo (96.5 Mpx, within
    ``SCORER_MAX_REQUEST_PIXELS``): one decoding and one encoding, every reference its score;
    the worker's CPU time is about that of one reference (encoded once per reference, it was
    over 5 times as much)."""
    pixels = np.random.default_rng(3).integers(0, 256, (2048, 2048, 3), dtype=np.uint8)
    image, expected = png(pixels), reference.incompressibility(pixels)
    server = servers["jpeg_incompressibility"]
    (pid,) = server.worker_pids()
    scores(server.url, [png(pixels[:64, :64])])  # the worker warm
    spent = {}
    for count in (1, 23):
        before = cpu_seconds(pid)
        assert scores(server.url, [image] * count)["scores"] == [expected] * count
        spent[count] = cpu_seconds(pid) - before
    assert spent[23] < 2 * spent[1], spent


def shown_pixels() -> list[tuple[str, bytes, np.ndarray]]:
    """Files in the modes a PNG or JPEG can carry, each with the RGB pixels a viewer shows of it:
    grey repeated in three channels, 16-bit grey scaled (multiples of 257, so that every scaling
    agrees), bilevel black and white, a palette's colours, transparency over white."""
    grey = np.random.default_rng(5).integers(0, 256, (40, 56), dtype=np.uint8)
    rgb = np.dstack([grey, grey[::-1], 255 - grey])
    alpha = np.where(grey > 127, 255, 0).astype(np.uint8)
    as_rgb = np.repeat(grey[:, :, None], 3, axis=2)
    over_white = np.where(alpha[:, :, None] == 255, rgb, 255).astype(np.uint8)
    grey_over_white = np.where(alpha[:, :, None] == 255, as_rgb, 255).astype(np.uint8)
    palette = Image.fromarray(rgb).quantize(16)
    palette_rgb = np.asarray(palette.convert("RGB"))
    bilevel = grey > 127
    return [
        ("L", png(grey), as_rgb),
        ("I;16", encode(Image.fromarray(grey.astype(np.uint16) * 257), "PNG"), as_rgb),
        ("1", encode(Image.fromarray(bilevel), "PNG"), np.repeat(bilevel[:, :, None] * np.uint8(255), 3, axis=2)),
        ("P", encode(palette, "PNG"), palette_rgb),
        ("RGBA", encode(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG"), over_white),
        ("LA", encode(Image.fromarray(np.dstack([grey, alpha]), "LA"), "PNG"), grey_over_white),
        ("RGB", png(rgb), rgb),
    ]


def test_every_mode_is_scored_on_the_rgb_pixels_it_shows(servers: dict[str, Server]) -> None:
    cases = shown_pixels()
    for rule, score in RULES.items():
        answer = scores(servers[rule].url, [data for _, data, _ in cases])["scores"]
        assert answer == [score(shown) for _, _, shown in cases], [mode for mode, _, _ in cases]


def test_a_grey_jpeg_and_a_cmyk_jpeg_are_scored_as_shown(servers: dict[str, Server]) -> None:
    """Single-channel and four-channel JPEGs: the RGB a viewer shows, saved as flow_grpo saves RGB."""
    grey = np.random.default_rng(9).integers(0, 256, (48, 48), dtype=np.uint8)
    grey_jpeg = encode(Image.fromarray(grey), "JPEG", quality=90)
    cmyk_jpeg = encode(Image.fromarray(np.dstack([grey] * 3)).convert("CMYK"), "JPEG", quality=90)
    answer = scores(servers["jpeg_incompressibility"].url, [grey_jpeg, cmyk_jpeg])["scores"]
    shown_grey = np.repeat(np.asarray(Image.open(io.BytesIO(grey_jpeg)))[:, :, None], 3, axis=2)
    shown_cmyk = np.asarray(Image.open(io.BytesIO(cmyk_jpeg)).convert("RGB"))
    assert answer == [reference.incompressibility(shown_grey), reference.incompressibility(shown_cmyk)]


def test_prompts_of_every_shape_leave_the_score_alone(servers: dict[str, Server]) -> None:
    """The rule reads no prompt: empty, unicode and 8,192-character prompts give the image's
    score; one past ``SCORER_MAX_PROMPT_CHARS`` is the core's 413; a prompt that is no string a 422."""
    pixels = sample_pixels()[1]
    image, expected = png(pixels), reference.compressibility(pixels)
    url = servers["jpeg_compressibility"].url
    prompts = ["", "un café ☕ \u202e", "x" * 8192]
    body = {"images": [image] * len(prompts), "prompts": prompts, "metadata": {}}
    answer = requests.post(url, data=pickle.dumps(body), timeout=120)
    assert answer.status_code == 200 and pickle.loads(answer.content)["scores"] == [expected] * 3
    for prompt, status in (("x" * 8193, 413), (None, 422)):
        body = {"images": [image], "prompts": [prompt], "metadata": {}}
        refused = requests.post(url, data=pickle.dumps(body), timeout=120)
        assert refused.status_code == status, refused.content[:300]


def test_multi_sums_the_jpeg_rewards_by_flow_grpos_names(servers: dict[str, Server], multi: Server) -> None:
    """A flow_grpo ``reward_fn`` dict in ``metadata["rewards"]``, and the same in the URL: each
    reward's details are its own service's scores, the sum their weighted sum."""
    pngs = [png(p) for p in sample_pixels()]
    alone = {rule: scores(server.url, pngs)["scores"] for rule, server in servers.items()}
    weights = {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.01}
    for answer in (
        scores(multi.url, pngs, {"rewards": weights}),
        scores(f"{multi.url}/?jpeg_compressibility=1&jpeg_incompressibility=0.01", pngs),
    ):
        assert answer["details"] == alone
        assert answer["scores"] == [
            c + 0.01 * i for c, i in zip(alone["jpeg_compressibility"], alone["jpeg_incompressibility"])
        ]
