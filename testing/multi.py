"""The ``multi`` service (several image rewards in one call) for tests and benchmarks: tiny random
models of the CLIP-family rewards saved as the real ones are laid out, RapidOCR's own models,
and each reward's own service settings pointing at them, so that the same settings start the
single services to compare with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from testing.clip_models import save_random_clip_model
from testing.imagereward_models import save_checkpoint, save_tokenizer
from testing.random_clip import save_random_clip
from testing.server import Server, gunicorn_server

# The rewards these helpers can give models to on a machine without weights (HPSv2 and HPSv3
# need the reference environment's open_clip or a Qwen2-VL: not here).
TINY_REWARDS = ("ocr", "aesthetic", "pickscore", "clipscore", "imagereward")


def reward_settings(rewards: Sequence[str], directory: Path) -> dict[str, str]:
    """``SCORER_MULTI_REWARDS`` and each reward's own settings (``SCORER_PICKSCORE_MODEL``, ...),
    tiny random models written under ``directory``, on the CPU."""
    settings = {"SCORER_MULTI_REWARDS": ",".join(rewards), "SCORER_DEVICE": "cpu"}
    for name in rewards:
        if name == "aesthetic":
            settings["SCORER_AESTHETIC_CLIP"] = str(save_random_clip(directory / name, size="tiny"))
        elif name in ("pickscore", "clipscore"):
            # PickScore is a ViT-H/14 (GELU); OpenAI's ViT-L/14 uses quick GELU.
            activation = "gelu" if name == "pickscore" else "quick_gelu"
            model = save_random_clip_model(directory / name, hidden_act=activation)
            settings[f"SCORER_{name.upper()}_MODEL"] = str(model)
        elif name == "imagereward":
            settings["SCORER_IMAGEREWARD_WEIGHTS"] = str(save_checkpoint(directory / name / "weights"))
            settings["SCORER_IMAGEREWARD_TOKENIZER"] = str(save_tokenizer(directory / name / "tokenizer"))
        elif name != "ocr":
            raise ValueError(f"no tiny model for {name!r}; choose among {', '.join(TINY_REWARDS)}")
    return settings


@contextlib.contextmanager
def multi_server(
    rewards: Sequence[str], directory: Path, env: dict[str, str] | None = None, **options: Any
) -> Iterator[Server]:
    """The ``multi`` service serving ``rewards`` on tiny models written under ``directory``
    (``env`` on top); ``options`` as ``gunicorn_server``'s (``threads``, ``log_dir``, ...)."""
    with gunicorn_server("multi", {**reward_settings(rewards, directory), **(env or {})}, **options) as server:
        yield server
