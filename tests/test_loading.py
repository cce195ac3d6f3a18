"""The image scorers' one loading path (``common.models.loading``): a load error of a kind the scorer
names is the config error naming the setting, another error stays itself, and the warm-up runs
a full micro-batch on a GPU and one image on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PIL import Image

from common.configuration.config import ConfigError
from common.models.loading import Refusal, load_model, require_weights, warm_up

pytestmark = pytest.mark.unit


class HeadError(ValueError):
    pass


def fails_with(error: Exception) -> Callable[[], object]:
    def load() -> object:
        raise error

    return load


def test_an_error_a_refusal_names_is_the_setting_to_fix() -> None:
    unreadable = Refusal(OSError, "SCORER_X_MODEL='/m' could not be loaded", "Set SCORER_X_MODEL to a directory.")
    not_a_head = Refusal((HeadError, KeyError), "SCORER_X_HEAD='/h' is not a head")
    with pytest.raises(ConfigError) as raised:
        load_model("cpu", fails_with(FileNotFoundError("no config.json")), unreadable, not_a_head)
    assert str(raised.value) == (
        "SCORER_X_MODEL='/m' could not be loaded: no config.json Set SCORER_X_MODEL to a directory."
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    with pytest.raises(ConfigError, match=r"^SCORER_X_HEAD='/h' is not a head: 'layers.0'$"):
        load_model("cpu", fails_with(KeyError("layers.0")), unreadable, not_a_head)
    # The first refusal that matches: a HeadError is a ValueError too.
    either = Refusal(ValueError, "any value error")
    with pytest.raises(ConfigError, match=r"^SCORER_X_HEAD"):
        load_model("cpu", fails_with(HeadError("shape")), not_a_head, either)


def test_an_error_no_refusal_names_stays_itself() -> None:
    with pytest.raises(RuntimeError, match="out of memory"):
        load_model("cpu", fails_with(RuntimeError("out of memory")), Refusal(OSError, "unreadable"))
    assert load_model("cpu", lambda: "the model", Refusal(OSError, "unreadable")) == "the model"


def test_missing_weights_are_refused_before_anything_loads() -> None:
    require_weights(None)
    with pytest.raises(ConfigError, match=r"^weights not found: SCORER_X_MODEL"):
        require_weights("weights not found: SCORER_X_MODEL='/m' is not a directory")


def test_the_warm_up_is_a_micro_batch_on_a_gpu_and_one_image_on_the_cpu() -> None:
    calls: list[tuple[list[Image.Image], list[str]]] = []
    warm_up(lambda images, prompts: calls.append((images, prompts)), "cuda:0", 32, size=224)
    warm_up(lambda images, prompts: calls.append((images, prompts)), "cpu", 32)
    assert [len(images) for images, _ in calls] == [32, 1]
    assert [len(prompts) for _, prompts in calls] == [32, 1]
    assert calls[0][0][0].size == (224, 224) and calls[1][0][0].size == (256, 256)
    assert calls[1][0][0].mode == "RGB"
