"""Each language's record (``services/code/languages.py``) is whole and agrees with everything
that reads it: its aliases name it alone, its commands fill in, its compiler is a package's
command (or the pinned Go), its default time scale is the setting's default, its SandboxFusion
name is one SandboxFusion has, and a language programs may be written in has its cases
(``testing/code_cases.py``), which the server tests grade, and its row in the README. Parametrised over the records: a
new record is checked here with no test edited (docs/adding-a-language.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from common.setup import install
from services.code import languages
from services.code.languages import LANGUAGES, Language, TimeScale
from services.code.protocols.sandbox_fusion.api import NOT_SERVED
from services.code.settings import CodeSettings
from testing.code_cases import CASES, TAGS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

RECORDS = list(LANGUAGES.values())
GRADED = [lang for lang in RECORDS if lang.aliases]


def test_each_alias_names_one_language_in_any_case() -> None:
    named = [*languages.PYTHON_ALIASES, *(alias for lang in RECORDS for alias in lang.aliases)]
    assert len(named) == len(set(named)) == len(languages.ALIASES)
    for lang in GRADED:
        assert lang.name in lang.aliases
        for alias in lang.aliases:
            assert alias == alias.lower() and " " not in alias
            assert languages.language_of(alias.upper()) == lang.name


@pytest.mark.parametrize("lang", RECORDS, ids=lambda lang: lang.name)
def test_its_commands_fill_in(lang: Language) -> None:
    """Every ``{placeholder}`` of its build and run is one ``program`` fills."""
    program = languages.program(lang, "int main(){}\n", {}, {}, 256)
    assert program.build and program.run
    assert not [part for part in (*program.build, *program.run) if "{" in part or "}" in part]
    assert program.source_path.endswith(f".{lang.extension}")


@pytest.mark.parametrize("lang", [lang for lang in RECORDS if lang.tools], ids=lambda lang: lang.name)
def test_its_compiler_is_what_run_sh_installs(lang: Language) -> None:
    """The compiler is the command of one of its packages (run.sh counts the package installed
    by it, where the sandbox looks) or the pinned Go, which run.sh installs itself."""
    commands = {package.command for package in lang.packages}
    assert lang.tools[0] in commands | {install.GO_COMMAND}
    known = install.known_packages()
    assert all(known[p.name] == dataclasses.replace(p, dirs=install.SANDBOX_TOOL_DIRS) for p in lang.packages)


@pytest.mark.parametrize("lang", RECORDS, ids=lambda lang: lang.name)
def test_its_time_scale_is_the_settings_default(lang: Language) -> None:
    scales = languages.time_scales(CodeSettings().time_scales)
    assert scales.get(lang.name, TimeScale()) == lang.time_scale


@pytest.mark.parametrize("lang", [lang for lang in RECORDS if lang.sandbox_fusion], ids=lambda lang: lang.name)
def test_its_sandbox_fusion_name_is_served(lang: Language) -> None:
    assert lang.sandbox_fusion not in NOT_SERVED
    assert languages.SANDBOX_FUSION_NAMES[lang.sandbox_fusion] == lang.name


@pytest.mark.parametrize("lang", GRADED, ids=lambda lang: lang.name)
def test_a_language_programs_are_written_in_has_its_cases(lang: Language) -> None:
    """Its cases, or those of a language of its family (the C++ standards share g++'s): what
    ``test_code_languages`` grades on the running server, each to its verdict."""
    family = [name for name in CASES if LANGUAGES[name].extension == lang.extension]
    assert family, f"{lang.name}: add its cases and fence tag to testing/code_cases.py (CASES, TAGS)"
    for name in family:
        assert languages.language_of(TAGS[name]) == name
        assert {case for case, _, _ in CASES[name]} >= {"ok", "wrong", "loop", "alloc", "crash", "syntax", "flood"}


@pytest.mark.parametrize("lang", GRADED, ids=lambda lang: lang.name)
def test_the_readme_has_its_row_and_its_aliases(lang: Language) -> None:
    """services/code/README.md's language table has a row named by its title's first word,
    and the paragraph above it names each of its aliases."""
    readme = (ROOT / "services" / "code" / "README.md").read_text()
    languages_section = readme[readme.index("### Languages") :]
    rows = {line.split("|")[1].strip() for line in languages_section.splitlines() if line.startswith("| ")}
    assert lang.title.split()[0] in rows
    assert all(f"`{alias}`" in languages_section for alias in lang.aliases)
