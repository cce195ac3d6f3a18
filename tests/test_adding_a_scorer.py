"""Adding an image scorer is what docs/services.md says: in a copy of the tree, the page's
example scorer (its module), its registry entry, a requirements file of its own, the page's
example settings with the README that holds their table, and its line in docs/ARCHITECTURE.md's
layout, then ``python -m common.setup.settings_docs``; nothing else is edited. The suite's generic
checks then hold over it (the registry, preflight, the settings pages, multi's image entries,
the module list and the import graph), and it serves the core protocol under gunicorn, alone and
through ``multi``."""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from PIL import Image

from common.sdk.rewards import rewards_url
from testing.images import encode
from testing.server import ROOT, gunicorn_server

SERVICES_PAGE = ROOT / "docs" / "services.md"
NAME = "brightness"
# The generic tests a new service meets, run in the copy as they are.
GENERIC_TESTS = (
    "tests/test_registry.py",
    "tests/test_preflight.py",
    "tests/test_settings_docs.py",
    "tests/test_settings_documented.py",
    "tests/test_multi_requests.py",
    "tests/test_architecture.py",
    "tests/test_imports.py",
    "tests/test_file_lengths.py",
    "tests/test_readme.py::test_the_example_entry_is_a_registry_entry",
)


def example(marker: str) -> str:
    """The code block after ``<!-- marker -->`` in docs/services.md, as the page shows it."""
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", SERVICES_PAGE.read_text(), re.DOTALL)
    assert match, f"no code block after <!-- {marker} --> in docs/services.md"
    return match.group(1)


# What .gitignore leaves out besides dot-files (environments, caches): bench results, weights, scratch.
# What .gitignore keeps out of the tree, where it keeps it out (``common/models/`` is code).
NOT_THE_TREE = {Path("."): {"models", "var"}, Path("bench"): {"results"}}


def ignored(directory: str, names: list[str]) -> list[str]:
    """Not the tree a newcomer edits: environments, caches, git's own files, results and weights."""
    here = NOT_THE_TREE.get(Path(directory).relative_to(ROOT), set())
    return [name for name in names if name.startswith(".") or name == "__pycache__" or name in here]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the tree with the example scorer added as the page says, and nothing else edited."""
    copy = tmp_path_factory.mktemp("new-scorer") / "repo"
    shutil.copytree(ROOT, copy, ignore=ignored)
    (copy / "services" / NAME).mkdir()
    (copy / "services" / NAME / "scorer.py").write_text(example("example scorer").split("\n", 1)[1])
    # A model's packages: a requirements file of its own, named in the entry.
    numpy = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("numpy"))
    (copy / f"requirements-{NAME}.txt").write_text(f"# The brightness scorer's own packages.\n{numpy}\n")
    # Settings of its own, and the page their table stands on.
    (copy / "services" / NAME / "settings.py").write_text(example("example settings").split("\n", 1)[1])
    markers = f"<!-- settings:{NAME}:start -->\n<!-- settings:{NAME}:end -->\n"
    (copy / "services" / NAME / "README.md").write_text(f"# brightness\n\n## Settings\n\n{markers}")
    entry = example("example entry").split("\n", 1)[1]
    assert '("requirements.txt",)' in entry, entry
    entry = entry.replace('("requirements.txt",)', f'("requirements.txt", "requirements-{NAME}.txt")')
    entry = entry.replace("\n)", f'\n    settings="services.{NAME}.settings:BrightnessSettings",\n)')
    registry = copy / "common" / "setup" / "registry.py"
    end = "\n    )\n}\n"
    assert registry.read_text().count(end) == 1
    indented = "".join(f"        {line}\n" if line else "\n" for line in entry.rstrip().splitlines())
    registry.write_text(registry.read_text().replace(end, f"\n{indented.rstrip()},{end}"))
    architecture = copy / "docs" / "ARCHITECTURE.md"
    line = f"services/{NAME}/  scorer.py: how bright each image is (docs/services.md's example)\n"
    text = architecture.read_text()
    first_service = text.index("\nservices/aesthetic/") + 1
    architecture.write_text(text[:first_service] + line + text[first_service:])
    regenerate = [sys.executable, "-m", "common.setup.settings_docs"]
    done = subprocess.run(regenerate, cwd=copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    yield copy


@pytest.mark.unit
def test_the_page_names_every_file_the_test_adds() -> None:
    """What the test edits is what the page tells a newcomer to edit."""
    page = SERVICES_PAGE.read_text().split("## Adding a scorer", 1)[1]
    steps = (
        *("services/brightness/scorer.py", "common/setup/registry.py", "image=True", "requirements-brightness.txt"),
        *("services/brightness/settings.py", "services/brightness/README.md", "settings:brightness:start"),
        *("docs/ARCHITECTURE.md", 'settings="services.brightness.settings:BrightnessSettings"'),
    )
    for step in steps:
        assert step in page, step
    assert "python -m common.setup.settings_docs" in page.replace("\n", " ")


def test_the_suites_generic_checks_hold_over_it(tree: Path) -> None:
    # Generated: its batching default and its settings' rows, on the settings page and its README.
    assert f"{NAME} 32" in (tree / "docs" / "settings.md").read_text()
    for page in ("docs/settings.md", f"services/{NAME}/README.md"):
        assert "| `SCORER_BRIGHTNESS_WHITE` | `--white` | `255` |" in (tree / page).read_text(), page
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "unit", *GENERIC_TESTS],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "error" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


def png(colour: str) -> bytes:
    return encode(Image.new("RGB", (64, 32), colour), "PNG")


def test_it_serves_the_core_protocol_alone_and_through_multi(tree: Path, tmp_path: Path) -> None:
    body = pickle.dumps({"images": [png("white"), png("black")], "prompts": ["", ""], "metadata": {}})
    with gunicorn_server(NAME, root=tree, log_dir=tmp_path) as server:
        assert requests.get(server.url + "/ready", timeout=10).status_code == 200
        answer = requests.post(server.url, data=body, timeout=60)
        assert answer.status_code == 200, answer.content[:300]
        assert pickle.loads(answer.content)["scores"] == [1.0, 0.0]
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        assert re.search(rf'^scorer_requests_total\{{[^}}]*service="{NAME}"[^}}]*\}} 1\.0$', metrics, re.M), metrics
    # A bad value of its own setting stops the master before a worker starts, naming the variable.
    bad = {"SCORER_BRIGHTNESS_WHITE": "0"}
    refused = pytest.raises(RuntimeError, match="SCORER_BRIGHTNESS_WHITE='0': must be at least 1")
    with refused, gunicorn_server(NAME, env=bad, root=tree, log_dir=tmp_path):
        pass
    env = {"SCORER_MULTI_REWARDS": f"{NAME},jpeg_compressibility"}
    with gunicorn_server("multi", env=env, root=tree, log_dir=tmp_path) as multi:
        assert requests.get(multi.url + "/ready", timeout=10).status_code == 200
        answer = requests.post(rewards_url(multi.url, {NAME: 2.0}), data=body, timeout=60)
        assert answer.status_code == 200, answer.content[:300]
        assert pickle.loads(answer.content)["scores"] == [2.0, 0.0]
