"""The ``multi`` service's pieces in process: the rewards a request names (URL query, metadata),
the query the clients build, which rewards a node can serve together and the environment
``run.sh multi`` builds for them, and how each image's results make each sample's."""

from __future__ import annotations

import math

import pytest

from common.configuration.settings import CoreSettings
from common.imaging.media import MEAN, MediaRequest
from common.limits.errors import PayloadTooLarge, Unprocessable
from common.pipeline.scorer import ImageScorer
from common.sdk.rewards import rewards_url
from common.setup import install, registry, shell
from services.multi.combine import Combined, combined_results
from services.multi.settings import listed_rewards
from services.multi.wanted import Wanted, from_query, requested

pytestmark = pytest.mark.unit

SERVED = ["ocr", "pickscore", "aesthetic"]


def test_the_url_wins_then_metadata_then_every_reward_at_one() -> None:
    metadata = {"rewards": {"ocr": 0.2, "pickscore": {"weight": 0.8, "optional": True}}}
    assert requested([("aesthetic", "2")], metadata, SERVED) == {"aesthetic": Wanted(2.0)}
    assert requested([], metadata, SERVED) == {"ocr": Wanted(0.2), "pickscore": Wanted(0.8, optional=True)}
    assert requested([], {}, SERVED) == {name: Wanted(1.0) for name in SERVED}


def test_query_weights_and_the_optional_mark() -> None:
    assert from_query([("ocr", "0.7"), ("pickscore", "-0.3!optional")], SERVED) == {
        "ocr": Wanted(0.7),
        "pickscore": Wanted(-0.3, optional=True),
    }
    plain = from_query([("ocr", "+.5"), ("pickscore", "2.e-1")], SERVED)
    assert plain == {"ocr": Wanted(0.5), "pickscore": Wanted(0.2)}


@pytest.mark.parametrize(
    "query",
    [
        [("ocr", "inf")], [("ocr", "1e999")], [("ocr", "!optional")], [("ocr", "1!optional!optional")], [("", "1")],
        # Texts Python's float reads that no client means by a weight.
        [("ocr", "1_0")], [("ocr", " 1")], [("ocr", "\u0661")], [("ocr", "\uff11")], [("ocr", "0x1")], [("ocr", "nan")],
    ],
)  # fmt: skip
def test_bad_query_weights_are_refused(query: list[tuple[str, str]]) -> None:
    with pytest.raises(Unprocessable):
        from_query(query, SERVED)


@pytest.mark.parametrize(
    "weight",
    [10**400, float("nan"), None, "1", [1], {"weight": 1, "extra": 2}, {"optional": True}, {"weight": "1"}],
)
def test_bad_metadata_weights_are_refused(weight: object) -> None:
    with pytest.raises(Unprocessable):
        requested([], {"rewards": {"ocr": weight}}, SERVED)


def test_a_reward_named_by_its_alias_is_that_reward_keyed_by_the_alias() -> None:
    """flow_grpo's names of the judges (``qwenvl``; ``unifiedreward``, UnifiedReward v1): the
    served reward, its ``details`` keyed by the name the request gave."""
    aliases = {"qwenvl": "judge"}
    served = ["ocr", "judge"]
    assert requested([("qwenvl", "0.5!optional")], {}, served, aliases) == {"judge": Wanted(0.5, True, "qwenvl")}
    assert requested([], {"rewards": {"ocr": 1, "qwenvl": 2}}, served, aliases) == {
        "ocr": Wanted(1.0),
        "judge": Wanted(2.0, alias="qwenvl"),
    }
    with pytest.raises(Unprocessable, match=r"gives 'judge' twice \(as 'qwenvl'\)"):
        requested([], {"rewards": {"judge": 1, "qwenvl": 2}}, served, aliases)
    with pytest.raises(Unprocessable, match=r"names 'unifiedreward'.*serves ocr, judge \(also by the names qwenvl\)"):
        requested([("unifiedreward", "1")], {}, served, aliases)
    images = [{"ocr": 1.0, "judge": 0.8}]
    (result,) = combined_results(
        images, {"ocr": Wanted(1.0), "judge": Wanted(0.5, alias="qwenvl")}, [range(1)], None, {}
    )
    assert isinstance(result, Combined) and result.details == {"ocr": 1.0, "qwenvl": 0.8} and result.score == 1.4


def test_the_clients_query() -> None:
    assert rewards_url("http://node:18100") == "http://node:18100/"
    url = rewards_url("http://node:18100/", {"ocr": 0.7, "pickscore": 0.3}, optional=["pickscore"])
    assert url == "http://node:18100/?ocr=0.7&pickscore=0.3!optional"
    assert rewards_url("http://node:18100/?ocr=1", {"aesthetic": 2}) == "http://node:18100/?ocr=1&aesthetic=2.0"
    with pytest.raises(ValueError, match="no weight"):
        rewards_url("http://node:18100", {"ocr": 1}, optional=["pickscore"])


def test_which_rewards_a_node_serves_together() -> None:
    assert listed_rewards({"SCORER_MULTI_REWARDS": " ocr, pickscore "}) == ("ocr", "pickscore")
    for listed, message in (
        ("", "serves no reward"),
        ("ocr,code", "not an image scorer"),
        ("ocr,ocr", "twice"),
        ("multi", "not an image scorer"),
    ):
        with pytest.raises(ValueError, match=message):
            listed_rewards({"SCORER_MULTI_REWARDS": listed})
    # PaddleOCR's packages clash with RapidOCR's and the CLIP family's: its own environment only.
    with pytest.raises(ValueError, match=r"SCORER_OCR_ENGINE=paddleocr .* cannot serve it"):
        listed_rewards({"SCORER_MULTI_REWARDS": "ocr,pickscore", "SCORER_OCR_ENGINE": "paddleocr"})


def test_the_image_entries_are_image_scorers() -> None:
    """What the multi service may list: the entries marked ``image``, each an ``ImageScorer``
    (one decode shared by all), and every ``ImageScorer`` of the registry marked so."""
    images = {name for name, service in registry.SERVICES.items() if service.image}
    assert {"ocr", "aesthetic", "imagereward", "judge", "jpeg_compressibility"} <= images
    assert {"code", "multi"}.isdisjoint(images)
    assert images == {name for name in registry.SERVICES if issubclass(registry.load_scorer_class(name), ImageScorer)}


def test_run_sh_builds_one_environment_of_the_listed_rewards_requirements() -> None:
    setup = install.setup_of("multi", {"SCORER_MULTI_REWARDS": "ocr,pickscore,aesthetic"})
    assert setup.venv == ".venv-multi" and setup.port == 18100
    assert setup.requirements == ("requirements.txt", "requirements-ocr.txt", "requirements-clip.txt")
    assert setup.no_deps == registry.SERVICES["ocr"].no_deps
    assert setup.gpu_requirements == ("requirements-ocr-torch.txt",)
    torch_ocr = install.setup_of("multi", {"SCORER_MULTI_REWARDS": "ocr", "SCORER_OCR_ENGINE": "torch"})
    assert "requirements-ocr-torch.txt" in torch_ocr.requirements
    flags = "--port=SCORER_PORT --workers=SCORER_WORKERS --rewards=SCORER_MULTI_REWARDS"
    assert shell.flags_shell("multi") == f"FLAGS=({flags})"


UNIT = (0.0, 1.0)
UNBOUNDED = (-math.inf, math.inf)


def test_each_samples_result_from_its_images_results() -> None:
    wanted = {"ocr": Wanted(0.5, optional=True), "pickscore": Wanted(2.0)}
    bounds = {"ocr": UNIT, "pickscore": UNBOUNDED}
    failure = PayloadTooLarge("too many quoted targets")
    images = [{"ocr": 1.0, "pickscore": 0.25}, {"ocr": failure, "pickscore": 0.5}]
    first, second = combined_results(images, wanted, [range(0, 1), range(1, 2)], None, bounds)
    assert first == Combined(1.0, details={"ocr": 1.0, "pickscore": 0.25}, dropped=False)
    # The dropped reward counts at its lowest score (0.5 x 0), the others as scored.
    assert isinstance(second, Combined) and second.score == 1.0 and second.dropped
    assert math.isnan(second.details["ocr"])
    # A video: each reward's frames by its rule, then the sum.
    frames = [{"ocr": 1.0, "pickscore": 0.0}, {"ocr": 0.0, "pickscore": 1.0}]
    (video,) = combined_results(frames, wanted, [range(0, 2)], {"ocr": MEAN, "pickscore": MEAN}, bounds)
    assert video.score == pytest.approx(0.5 * 0.5 + 2.0 * 0.5)
    # A required reward's error is the request's, as its own service's.
    with pytest.raises(PayloadTooLarge):
        combined_results([{"ocr": 1.0, "pickscore": failure}], wanted, [range(0, 1)], None, bounds)


def test_a_sample_with_nothing_left_to_measure_it_gets_nan_alone() -> None:
    """A judge's parse failure under ``nan`` (or ``mean`` with no reply parsed) is its own
    service's NaN for that sample: a required reward's makes that sample's sum NaN, never a 500
    for the request; a sample every reward failed for, or that dropped a reward with no lowest
    score, gets NaN, and the other samples their sums."""
    failure = Unprocessable("prompts[1] has no other sample in the request")
    required = {"judge": Wanted(1.0), "ocr": Wanted(1.0)}
    bounds = {"judge": UNBOUNDED, "ocr": UNIT}
    images = [{"judge": 0.5, "ocr": 1.0}, {"judge": math.nan, "ocr": 1.0}]
    scored, unjudged = combined_results(images, required, [range(0, 1), range(1, 2)], None, bounds)
    assert scored.score == 1.5 and math.isnan(unjudged.score) and not unjudged.dropped
    optional = {"judge": Wanted(1.0, optional=True), "ocr": Wanted(1.0, optional=True)}
    images = [{"judge": 0.5, "ocr": 1.0}, {"judge": failure, "ocr": failure}, {"judge": math.nan, "ocr": 0.25}]
    first, failed, unbounded = combined_results(images, optional, [range(i, i + 1) for i in range(3)], None, bounds)
    assert first.score == 1.5 and not first.dropped
    assert math.isnan(failed.score) and failed.dropped  # nothing left: no sum, never 0
    assert math.isnan(unbounded.score) and unbounded.dropped  # the judge declares no lowest score here
    # No sample left anything (a bound on the request together): the request's error, as before.
    with pytest.raises(Unprocessable):
        combined_results([{"judge": failure, "ocr": failure}] * 2, optional, [range(0, 1), range(1, 2)], None, bounds)


@pytest.mark.parametrize("weight", [2.0, -0.5, 0.0])
@pytest.mark.parametrize("bounds", [UNIT, (-14.0, 1.0), (-3.5, 3.5)])
def test_a_dropped_reward_never_raises_a_samples_sum(weight: float, bounds: tuple[float, float]) -> None:
    """GenEval scores down to 2 - max_objects, CLIP scores are signed, weights may be negative:
    whatever the dropped reward would have scored, the sample's sum with it dropped is no higher
    than with it scored."""
    wanted = {"geneval": Wanted(weight, optional=True), "ocr": Wanted(1.0)}
    every = {"geneval": bounds, "ocr": UNIT}
    failure = Unprocessable("metadata['geneval'][0]: unknown tag")
    (dropped,) = combined_results([{"geneval": failure, "ocr": 0.5}], wanted, [range(0, 1)], None, every)
    assert dropped.dropped
    low, high = bounds
    for score in [low, high, *(low + (high - low) * step / 8 for step in range(1, 8))]:
        (scored,) = combined_results([{"geneval": score, "ocr": 0.5}], wanted, [range(0, 1)], None, every)
        assert dropped.score <= scored.score, (score, dropped.score, scored.score)


@pytest.mark.parametrize("weight", [2.0, -0.5, 0.0])
@pytest.mark.parametrize("name", ["jpeg_compressibility", "jpeg_incompressibility"])
def test_a_dropped_jpeg_reward_never_raises_a_samples_sum(name: str, weight: float) -> None:
    """flow_grpo's JPEG compressibility (-kB / 500) is always negative and has no lowest score
    short of the pixel limit's worst case; its incompressibility (kB) no highest. Dropped where
    its worst term is unbounded (compressibility under a positive weight, incompressibility
    under a negative one), the sample gets no sum (NaN, no verdict); elsewhere its term is the
    weight times 0. Never above the sum with it scored, whatever size the JPEG would have had."""
    scorer = registry.load_scorer_class(name)(CoreSettings())
    wanted = {name: Wanted(weight, optional=True), "ocr": Wanted(1.0)}
    every = {name: scorer.score_bounds(), "ocr": UNIT}
    failure = Unprocessable("the JPEG encoder failed")
    (dropped,) = combined_results([{name: failure, "ocr": 0.5}], wanted, [range(0, 1)], None, every)
    assert dropped.dropped
    unbounded = weight > 0 if name == "jpeg_compressibility" else weight < 0
    assert math.isnan(dropped.score) if unbounded else dropped.score == 0.5
    for kb in [0.631, 5.3, 616.0, 40_000.0]:  # a 1x1 image's JPEG, ..., noise at the pixel limit
        (scored,) = combined_results([{name: scorer.reward(kb), "ocr": 0.5}], wanted, [range(0, 1)], None, every)
        assert unbounded or dropped.score <= scored.score, (kb, dropped.score, scored.score)


def test_each_samples_images_and_a_sample_alone() -> None:
    """What an optional reward's check sees of one sample: its image, or its video's chosen frames."""
    videos = MediaRequest(
        [b"a", b"b", b"c"], ["videos[0][0]", "videos[0][2]", "videos[1][0]"], ["p", "q"], {}, [[0, 2], [0]], MEAN
    )
    assert videos.spans == [range(0, 2), range(2, 3)]
    alone = videos.sample(1)
    assert (alone.images, alone.names, alone.prompts, alone.frames) == ([b"c"], ["videos[1][0]"], ["q"], [[0]])
    images = MediaRequest([b"a", b"b", b"c"], ["images[0]", "images[1]", "images[2]"], ["p", "q", "r"], {}, None, MEAN)
    assert images.spans == [range(0, 1), range(1, 2), range(2, 3)] and images.sample(1).names == ["images[1]"]
    # Samples taken together keep their positions in the client's request, gaps included.
    some = images.samples([0, 2])
    assert list(some.sample_positions) == [0, 2] and some.samples([1]).first_prompt == 2
