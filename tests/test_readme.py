"""The README's example scorer and registry entry work as the README says."""

from __future__ import annotations

import io
import os
import pickle
import re
import types
from pathlib import Path

import pytest
from PIL import Image

from common import registry
from common.app import create_app
from common.settings import CoreSettings

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[1] / "README.md"


def example(marker: str) -> str:
    """The code block after ``<!-- marker -->`` in the README."""
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert match, f"no code block after <!-- {marker} --> in the README"
    return match.group(1)


def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 32), colour).save(buffer, "PNG")
    return buffer.getvalue()


def test_the_example_scorer_serves_scores() -> None:
    module = types.ModuleType("brightness_example")
    exec(compile(example("example scorer"), "README.md", "exec"), module.__dict__)
    client = create_app(module.BrightnessScorer(CoreSettings())).test_client()
    body = pickle.dumps({"images": [png("white"), png("black")], "prompts": ["", ""], "metadata": {}})
    response = client.post("/", data=body, content_type="application/octet-stream")
    assert response.status_code == 200, response.data
    assert pickle.loads(response.data)["scores"] == [1.0, 0.0]
    bad = client.post("/", json={"images": ["not base64 of an image"], "prompts": [""]})
    assert bad.status_code == 422


def test_the_example_entry_is_a_registry_entry() -> None:
    entry = eval(example("example entry").split("\n", 1)[1], {"Service": registry.Service})
    assert entry.name == "brightness" and entry.port not in {s.port for s in registry.SERVICES.values()}
    assert all((README.parent / f).is_file() for f in entry.requirements)


def source_files(root: Path) -> list[Path]:
    """Code and documentation, outside hidden folders (.git, the virtual environments)."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(folder, name) for name in names if Path(name).suffix in {".py", ".md", ".sh", ".conf"}]
    return found


def test_references_point_into_the_architecture_document() -> None:
    """Every ``ARCHITECTURE.md §N`` in the repository names a section that exists; nothing cites
    the design brief outside the repository."""
    root = README.parent
    headings = re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", (root / "docs" / "ARCHITECTURE.md").read_text(), re.MULTILINE)
    files = source_files(root)
    cited = {
        (path.name, section)
        for path in files
        for section in re.findall(r"ARCHITECTURE\.md §(\d+(?:\.\d+)?)", path.read_text(errors="replace"))
    }
    assert cited, "no references found"
    assert {section for _, section in cited} <= set(headings), cited
    assert not [path for path in files if re.search(r"DESIGN \d", path.read_text(errors="replace"))]
