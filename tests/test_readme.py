# Over 400 lines: one checker per kind of documented command, each with the pages it reads.
"""What the README, docs/, deploy/README.md and the services' and benches' READMEs show works as
they say: the example scorer and registry entry, and every shell block, each run as written or,
where running it needs a GPU node, weights, the network or a long install, checked as far as it
can be without them (said per kind in ``check_command``)."""

from __future__ import annotations

import functools
import importlib
import io
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from common.configuration.settings import CoreSettings
from common.server.app import create_app
from common.setup import install, registry
from services.code.judging.statuses import STATUSES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SERVICES = ROOT / "docs" / "services.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
SERVICE_PAGES = sorted(ROOT.glob("services/*/README.md"))
BENCH_PAGES = sorted(ROOT.glob("bench/**/README.md"))
# A block that runs a bench's or a service's module, pytest (which collects the suite) or the
# hub's ``hf``: its imports (torch, transformers, huggingface_hub) take seconds to a minute a
# command, too long for the unit loop.
RUNS_A_MODULE = re.compile(r"-m (?:(?:bench|services)\.|pytest\b)|^hf ", re.MULTILINE)
# Those modules' commands, checked together in one interpreter per environment (``helps``).
BATCHED = ("bench.", "services.")
# The blocks another test runs as written: the marker before the block, and that test.
RUN_ELSEWHERE = {"smoke test": "tests/test_smoke.py"}
# A trainer's command-line argument: a Hydra override, ``[+]key.path=value``.
OVERRIDE = re.compile(r"\+?[\w.]+=\S+")


def example(marker: str) -> str:
    """The code block after ``<!-- marker -->`` in docs/services.md."""
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", SERVICES.read_text(), re.DOTALL)
    assert match, f"no code block after <!-- {marker} --> in docs/services.md"
    return match.group(1)


def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 32), colour).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.unit
def test_the_example_scorer_serves_scores() -> None:
    module = types.ModuleType("brightness_example")
    exec(compile(example("example scorer"), "docs/services.md", "exec"), module.__dict__)
    client = create_app(module.BrightnessScorer(CoreSettings())).test_client()
    body = pickle.dumps({"images": [png("white"), png("black")], "prompts": ["", ""], "metadata": {}})
    response = client.post("/", data=body, content_type="application/octet-stream")
    assert response.status_code == 200, response.data
    assert pickle.loads(response.data)["scores"] == [1.0, 0.0]
    bad = client.post("/", json={"images": ["not base64 of an image"], "prompts": [""]})
    assert bad.status_code == 422


@pytest.mark.unit
def test_the_example_entry_is_a_registry_entry() -> None:
    entry = eval(example("example entry").split("\n", 1)[1], {"Service": registry.Service})
    others = [service for service in registry.SERVICES.values() if service.name != entry.name]
    assert entry.name == "brightness" and entry.port not in {service.port for service in others}
    assert all((ROOT / f).is_file() for f in entry.requirements)


@dataclass(frozen=True)
class Block:
    """A shell block of a page: where it starts, the marker comment before it, its text."""

    page: str
    line: int
    marker: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def shell_blocks() -> list[Block]:
    """Every ```` ```bash ```` (or ``sh``, ``shell``) block of the pages, indented
    ones (in a list) included."""
    fence = re.compile(r"^(?:<!-- (.+?) -->\n)?( *)```(?:bash|sh|shell)\n(.*?)^\2```", re.MULTILINE | re.DOTALL)
    blocks = []
    for page in [*PAGES, *SERVICE_PAGES, *BENCH_PAGES]:
        text = page.read_text()
        for match in fence.finditer(text):
            line = text.count("\n", 0, match.start(2)) + 1
            blocks.append(
                Block(str(page.relative_to(ROOT)), line, match.group(1) or "", textwrap.dedent(match.group(3)))
            )
    return blocks


BLOCKS = shell_blocks()


def commands(block: Block) -> list[list[str]]:
    """The block's commands, one per line (a backslash continues it), comments dropped."""
    return [
        words for line in block.text.replace("\\\n", " ").splitlines() if (words := shlex.split(line, comments=True))
    ]


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", 120)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


def check_trainer_arguments(words: list[str]) -> None:
    """Hydra overrides: each one ``key=value``; a ``pkg://`` path of this repository imports
    and has the function its ``name=`` names (VeRL-Omni's own client is not here to import)."""
    assert all(OVERRIDE.fullmatch(word) for word in words), words
    names = {word.rsplit(".", 1)[0]: word.split("=", 1)[1] for word in words if ".name=" in word}
    for word in words:
        key, _, value = word.partition("=")
        if value.startswith("pkg://common."):
            module = importlib.import_module(value.removeprefix("pkg://"))
            assert callable(getattr(module, names.get(key.rsplit(".", 1)[0], "compute_score"))), word


# A trainer's command-line flag (OpenRLHF's): ``--key.path``, its value the next word if any.
FLAG = re.compile(r"--[a-z][\w.]*")
# A pinned requirement, as a pip command names one, its extras included (``deepgym[server]==0.6.2``).
PIN = re.compile(r"[A-Za-z0-9][\w.-]*(?:\[[\w,-]+\])?==[\w.]+")
# The interpreters a command may name: the test environment's, and those ``bash run.sh`` builds.
PYTHONS = {"python", "python3", ".venv/bin/python"} | {
    f"{install.setup_of(name, {}).venv}/bin/python" for name in registry.SERVICES if name != "multi"
}


def check_trainer_flags(words: list[str]) -> None:
    """A trainer's flags: ``--key.path``, each followed by at most one value."""
    assert FLAG.fullmatch(words[0]) and len(words) <= 2 and not any(w.startswith("-") for w in words[1:]), words


def check_script(words: list[str], env: dict[str, str]) -> None:
    """A bench script, which needs a GPU node or the network: it is bash, every flag given is one
    its ``case`` takes, and the interpreter it is given is one ``bash run.sh`` builds."""
    script = ROOT / words[1]
    assert script.is_file() and run(["bash", "-n", str(script)]).returncode == 0, words
    assert all(f"{w})" in script.read_text() for w in words[2:] if w.startswith("--")), words
    assert env.get("PYTHON", "python3") in PYTHONS, env


def check_module(words: list[str], env: dict[str, str], tmp_path: Path) -> None:
    """``python -m MODULE ARGS``, run with ``--help`` appended (a bench runs for minutes, a
    service's tool needs its weights) in the test environment: its parser takes the values,
    and every flag given is one it lists."""
    if words[1:3] == ["-m", "pytest"]:
        done = run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *words[3:]])
        assert done.returncode == 0, done.stdout
        return
    if words[1:3] == ["-m", "venv"]:
        done = run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / words[3])])
        assert done.returncode == 0, done.stderr
        return
    if words[1:3] == ["-m", "common.sdk.client"]:
        port = int(re.fullmatch(r"http://localhost:(\d+)", words[3]).group(1))  # type: ignore[union-attr]
        assert port in {s.port for s in registry.SERVICES.values()}, words
    assert words[1] == "-m" and words[2].startswith(("bench.", "common.", "services.")), words
    argv, environment = (*words[2:], "--help"), frozenset(env.items())
    done = helps(environment)[argv] if argv in documented_modules(environment) else run_modules([argv], env)[0]
    assert done["code"] == 0, (words, done["stderr"][-2000:])
    assert all(w.split("=")[0] in done["stdout"] for w in words[3:] if w.startswith("--")), (words, done["stdout"])


def run_modules(commands: list[tuple[str, ...]], env: dict[str, str]) -> list[dict[str, str | int]]:
    """``python -m MODULE ARGS`` for each command, in turn in one interpreter of the test
    environment (testing/module_help.py): each one's exit status, stdout and stderr."""
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "results.json"
        done = run(
            [sys.executable, "-m", "testing.module_help", str(results)],
            input=json.dumps(commands),
            env={**os.environ, **env},
            timeout=120 * len(commands),
        )
        assert done.returncode == 0 and results.is_file(), done.stderr[-2000:]
        return json.loads(results.read_text())


@functools.cache
def documented_modules(environment: frozenset[tuple[str, str]]) -> tuple[tuple[str, ...], ...]:
    """Every bench's and service's ``python -m MODULE ARGS``, ``--help`` appended, the pages show
    with this environment."""
    found = set()
    for block in BLOCKS:
        for words in commands(block):
            env, words = split_environment(words)
            module = words[2] if words[0] in PYTHONS and words[1:2] == ["-m"] and len(words) > 2 else ""
            if frozenset(env.items()) == environment and module.startswith(BATCHED):
                found.add((*words[2:], "--help"))
    return tuple(sorted(found))


@functools.cache
def helps(environment: frozenset[tuple[str, str]]) -> dict[tuple[str, ...], dict[str, str | int]]:
    """``documented_modules`` run once, in one interpreter: torch and transformers import once,
    not once a command."""
    batch = documented_modules(environment)
    return dict(zip(batch, run_modules(list(batch), dict(environment)), strict=True))


def check_python_code(words: list[str], tmp_path: Path) -> None:
    """``python -c CODE``: the one that takes verl's client out of its wheel runs as written,
    in a folder of the test's, on the wheel ``bash run.sh test`` downloaded; without it the
    code only compiles."""
    wheels = sorted((ROOT / ".verl-client").glob("verl-*.whl"))
    if ".verl-client" not in words[2] or not wheels:
        compile(words[2], "<the block>", "exec")
        return
    (tmp_path / ".verl-client").mkdir()
    shutil.copy(wheels[0], tmp_path / ".verl-client")
    done = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and (tmp_path / ".verl-client" / "utils.py").stat().st_size, done.stderr


def check_network(words: list[str], tmp_path: Path) -> None:
    """A download (needs the network): ``hf download`` runs as written offline, into a folder
    of the test's, and must get as far as the missing file without a warning about its
    arguments; ``pip`` takes the flags its ``--help`` lists and pinned requirements only."""
    if words[0] == "hf":
        argv = [str(Path(sys.executable).parent / "hf"), *words[1:]]
        argv[argv.index("--local-dir") + 1] = str(tmp_path / "models")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hub"), "NO_COLOR": "1"}
        done = run(argv, env=env)
        assert done.returncode == 1 and "offline mode is enabled" in done.stderr, (words, done.stderr)
        assert "Warning" not in done.stderr and "Ignoring" not in done.stderr, (words, done.stderr)
        return
    at = words.index("pip") + 1
    done = run([sys.executable, "-m", "pip", words[at], "--help"])
    assert done.returncode == 0, done.stderr
    flags = [w for w in words[at + 1 :] if w.startswith("-")]
    assert all(re.search(rf"(^|[ ,]){re.escape(f)}\b", done.stdout, re.MULTILINE) for f in flags), words
    values = [
        w for i, w in enumerate(words[at + 1 :], at + 1) if not w.startswith("-") and words[i - 1] not in {"-r", "-d"}
    ]
    assert all(PIN.fullmatch(v) for v in values), words
    assert all((ROOT / words[i + 1]).is_file() for i, w in enumerate(words) if w == "-r"), words


def split_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The environment assignments before a command (``KEY=value command``), and the command."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        key, _, value = words[0].partition("=")
        env[key] = value
        words = words[1:]
    return env, words


def check_command(words: list[str], prefixes: dict[str, Path], tmp_path: Path) -> None:
    """Run or check one command as its kind allows; a kind with no check here fails, so that a
    new command in the docs gets one."""
    env, words = split_environment(words)
    if words[:2] == ["bash", "run.sh"] and words[2:3] == ["test"]:
        # The suite's own command: CI runs it (a run inside the suite would run the suite).
        assert "bash run.sh test" in (ROOT / ".ci" / "run").read_text()
    elif words[:2] == ["bash", "run.sh"]:
        # Starting a service needs its weights, GPU or engine and a long install: its flags
        # are checked instead, by run.sh's own parser, which reads them all before `--help`.
        done = run([*words, "--help"])
        usage = "Builds .venv-mmdet" if words[2:3] == ["reference-mmdet"] else "Start the scorer services"
        assert done.returncode == 0 and usage in done.stdout, (words, done.stderr)
    elif words[0] == "bash" and words[1].startswith("bench/"):
        check_script(words, env)
    elif words[:3] == ["python3", "-m", "deploy.render_nginx"]:
        # Rendered as written into a folder of the test's, the node names made resolvable.
        at = words.index("--prefix") + 1
        prefixes[words[at]] = tmp_path / "lb"
        nodes = [re.sub(r"^[^:]+:", "127.0.0.1:", w) if ":" in w and not w.startswith("-") else w for w in words]
        nodes[at] = str(tmp_path / "lb")
        done = run(nodes)
        assert done.returncode == 0, done.stderr
    elif words[0] == "nginx":
        # Started, it would serve until stopped: its configuration is tested as written instead.
        if shutil.which("nginx") is None:
            pytest.skip("nginx is not installed (bash run.sh test installs it)")
        at = words.index("-p") + 1
        assert words[at] in prefixes, f"{words}: no configuration rendered into {words[at]} before"
        done = run(["nginx", "-t", *words[1:at], str(prefixes[words[at]]), *words[at + 1 :]])
        assert done.returncode == 0 and "test is successful" in done.stderr, done.stderr
    elif words[0] == "hf" or "pip" in words[:3] or words[0].endswith("/bin/pip"):
        check_network([*words[:1], "pip", *words[1:]] if words[0].endswith("/bin/pip") else words, tmp_path)
    elif words[0] == "pytest":
        check_module(["python", "-m", *words], env, tmp_path)
    elif words[0] in PYTHONS and words[1] == "-c":
        check_python_code(words, tmp_path)
    elif words[0] in PYTHONS:
        check_module(words, env, tmp_path)
    elif words[0] == "source":
        assert words[1:] == [".venv/bin/activate"], words  # the environment the test runs in
    elif words[:3] == ["git", "worktree", "add"]:
        # A past measurement's baseline: the commit it checks out is in the history.
        done = run(["git", "cat-file", "-e", words[-1] + "^{commit}"])
        assert done.returncode == 0, f"{words}: no such commit ({done.stderr})"
    elif OVERRIDE.fullmatch(words[0]):
        check_trainer_arguments(words)
    elif FLAG.fullmatch(words[0]):
        check_trainer_flags(words)
    else:
        pytest.fail(f"no check for the command {shlex.join(words)}: add one to check_command")


def check_block(block: Block, tmp_path: Path) -> None:
    assert run(["bash", "-n"], input=block.text).returncode == 0, f"{block}: not bash"
    if block.marker in RUN_ELSEWHERE:
        assert (ROOT / RUN_ELSEWHERE[block.marker]).is_file()
        return
    if block.text.startswith("for "):
        # A loop that builds a trainer's arguments: run as written, its arguments checked.
        done = run(["bash", "-c", block.text + '\nprintf "%s\\n" "${args[@]}"'])
        assert done.returncode == 0, done.stderr
        check_trainer_arguments(done.stdout.split())
        return
    prefixes: dict[str, Path] = {}
    for words in commands(block):
        check_command(words, prefixes, tmp_path)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if "nginx" not in b.text and not RUNS_A_MODULE.search(b.text)], ids=str
)
@pytest.mark.integration  # runs run.sh, scripts and interpreters: not the in-process loop
def test_every_shell_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    check_block(block, tmp_path)


@pytest.mark.parametrize("block", [b for b in BLOCKS if RUNS_A_MODULE.search(b.text)], ids=str)
@pytest.mark.integration
def test_every_block_running_a_module_runs_as_written(block: Block, tmp_path: Path) -> None:
    check_block(block, tmp_path)


@pytest.mark.parametrize(
    "words",
    [
        ["python", "-m", "bench.batching.run", "--simple-requests", "1", "--no-such-flag"],
        ["python", "-m", "bench.batching.run", "--simple-requests", "many"],
        ["python", "-m", "bench.no_such_bench", "--rounds", "1"],
    ],
    ids=["flag", "value", "module"],
)
@pytest.mark.integration
def test_a_module_command_fails_on_what_its_module_does_not_take(words: list[str], tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        check_module(words, {}, tmp_path)


@pytest.mark.integration
def test_modules_run_together_answer_as_each_run_alone() -> None:
    """One interpreter for many commands: each one's status and output are its own, as a
    fresh ``python -m`` gives them, whatever ran before it."""
    good = ("bench.batching.run", "--simple-requests", "1", "--help")
    batch = [good, ("bench.batching.run", "--simple-requests", "many", "--help"), ("bench.no_such_bench",), good]
    results = run_modules(batch, {})
    assert [r["code"] for r in results] == [0, 2, 1, 0]
    alone = run([sys.executable, "-m", *good])
    assert results[0]["stdout"] == results[3]["stdout"] == alone.stdout and alone.returncode == 0
    assert "invalid int value: 'many'" in results[1]["stderr"] and not results[1]["stdout"]
    assert "No module named bench.no_such_bench" in results[2]["stderr"]


@pytest.mark.parametrize("block", [b for b in BLOCKS if "nginx" in b.text], ids=str)
@pytest.mark.integration
def test_every_nginx_block_renders_a_configuration_nginx_takes(block: Block, tmp_path: Path) -> None:
    prefixes: dict[str, Path] = {}
    for words in commands(block):
        check_command(words, prefixes, tmp_path)


@pytest.mark.unit
def test_the_blocks_are_found() -> None:
    """Every page's blocks are collected: each fence opened is closed, none is missed."""
    for page in [*PAGES, *SERVICE_PAGES, *BENCH_PAGES]:
        opened = len(re.findall(r"^ *```(?:bash|sh|shell)$", page.read_text(), re.MULTILINE))
        assert opened == sum(b.page == str(page.relative_to(ROOT)) for b in BLOCKS), page
    pages = {"README.md", "docs/deployment.md", "docs/protocols.md", "services/code/README.md", "bench/code/README.md"}
    assert {b.page for b in BLOCKS} >= pages


def source_files(root: Path) -> list[Path]:
    """Code and documentation, outside hidden folders (.git, the virtual environments)."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(folder, name) for name in names if Path(name).suffix in {".py", ".md", ".sh", ".conf"}]
    return found


@pytest.mark.unit
def test_references_point_into_the_architecture_document() -> None:
    """Every ``ARCHITECTURE.md §N`` in the repository names a section that exists; nothing cites
    the design brief outside the repository."""
    headings = re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "ARCHITECTURE.md").read_text(), re.MULTILINE)
    files = source_files(ROOT)
    cited = {
        (path.name, section)
        for path in files
        for section in re.findall(r"ARCHITECTURE\.md §(\d+(?:\.\d+)?)", path.read_text(errors="replace"))
    }
    assert cited, "no references found"
    assert {section for _, section in cited} <= set(headings), cited
    assert not [path for path in files if re.search(r"DESIGN \d", path.read_text(errors="replace"))]


@pytest.mark.unit
def test_the_architecture_names_every_code_status() -> None:
    """§7 lists every status the grader gives."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("- **Code verifier**") : text.index("## 8.")]
    assert not set(STATUSES) - set(re.findall(r"`([a-z_]+)`", section)), set(STATUSES)


@pytest.mark.unit
def test_every_page_is_linked_from_the_readme() -> None:
    """Each page of docs/, CHANGES.md and CONTRIBUTING.md, and each service's README is one
    click from the README; every relative link of the README and docs/ points at a file."""
    readme = README.read_text()
    pages = [*PAGES[1:], ROOT / "CHANGES.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("services/*/README.md")]
    assert not [p for p in pages if f"]({p.relative_to(ROOT)}" not in readme]
    for page in PAGES:
        for target, anchor in re.findall(r"\]\((?!https?:)([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            linked = page.parent / target if target else page
            assert linked.exists(), f"{page.relative_to(ROOT)} links to {target}, which is not there"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors(linked), f"{page.name} links to {target}#{anchor}: no such heading"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but - and _ dropped,
    spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
