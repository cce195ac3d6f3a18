"""The settings tables of the docs, made from the settings' declarations
(``common.configuration.config.setting``): every setting of the core and of each service, its variable, flag,
default and help.

A page holds the tables between markers: ``<!-- settings:start -->`` ... ``<!-- settings:end -->``
for every table (docs/settings.md), ``<!-- settings:NAME:start -->`` ... ``<!-- settings:NAME:end -->``
for service NAME's own (its README). ``python -m common.setup.settings_docs`` rewrites what is between
the markers of every page that holds them (in an environment with every service's packages: the
batching defaults are the scorer classes'); ``--print`` prints every table instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from common.configuration.config import Rule, Setting, declared, env_name
from common.configuration.settings import CoreSettings
from common.setup import registry

ROOT = Path(__file__).resolve().parents[2]
# A marked block: group 1 is ":NAME" for one service's table, empty for every table.
BLOCK = re.compile(r"<!-- settings(:[a-z0-9]+|):start -->.*?<!-- settings\1:end -->", re.DOTALL)
HEADER = "| variable | flag | default | meaning |\n|---|---|---|---|"


def tables() -> str:
    """The core's table, then one per service with settings of its own, in registry order."""
    sections = [f"## Every service (`SCORER_*`)\n\n{_table(CoreSettings, '')}"]
    for name in registry.SERVICES:
        own = registry.settings_class(name)
        if own is not None:
            sections.append(f"## {name} (`SCORER_{name.upper()}_*`)\n\n{_table(own, name)}")
    return "\n\n".join(sections)


def service_table(name: str) -> str:
    """Service ``name``'s own settings, then the core settings whose default is its own (the
    batching of a service that batches)."""
    own = registry.settings_class(name)
    if own is None:
        raise ValueError(f"the service {name!r} declares no settings of its own")
    table = _table(own, name)
    if registry.load_scorer_class(name).batched:
        table += "\n" + "\n".join(_core_rows_of(name))
    return table


def pages() -> list[Path]:
    """The pages that hold settings tables: those of ``docs/`` and each service's README."""
    candidates = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "services").glob("*/README.md"))]
    return [page for page in candidates if BLOCK.search(page.read_text())]


def render(page: str) -> str:
    """``page`` with the tables between each pair of markers replaced by the current ones."""

    def fill(block: re.Match[str]) -> str:
        service = block.group(1)
        body = service_table(service[1:]) if service else tables()
        return f"<!-- settings{service}:start -->\n{body}\n<!-- settings{service}:end -->"

    rendered, count = BLOCK.subn(fill, page)
    if not count:
        raise ValueError("the page has no <!-- settings:start --> ... <!-- settings:end --> pair")
    return rendered


def _core_rows_of(name: str) -> list[str]:
    scorer = registry.load_scorer_class(name)
    rows = []
    for field in dataclasses.fields(CoreSettings):
        declaration = declared(field)
        if declaration is not None and declaration.scorer_default:
            default = f"`{_value(getattr(scorer, declaration.scorer_default))}`"
            help_ = f"{declaration.help} (a core setting; this is {name}'s default)"
            rows.append(f"| `{env_name('', field.name)}` | {_flag(field, declaration)} | {default} | {help_} |")
    return rows


def _flag(field: dataclasses.Field, declaration: Setting) -> str:
    return f"`--{field.name.replace('_', '-')}`" if declaration.flag else ""


def _table(cls: type, section: str) -> str:
    rows = [HEADER]
    for field in dataclasses.fields(cls):
        declaration = declared(field)
        if declaration is None:
            raise ValueError(f"{cls.__name__}.{field.name} is not declared with common.configuration.config.setting")
        variable = f"`{env_name(section, field.name)}`"
        if declaration.renamed_from:
            former = env_name(section, declaration.renamed_from)
            variable += f" (formerly `{former}`, still read until the next release)"
        rows.append(
            f"| {variable} | {_flag(field, declaration)} | {_default(field, declaration)} | {_meaning(declaration)} |"
        )
    return "\n".join(rows)


def _meaning(declaration: Setting) -> str:
    """The help, and the rule the value must meet where the declaration states one."""
    rule = f" (must be {declaration.check.allowed})" if isinstance(declaration.check, Rule) else ""
    return declaration.help + rule


def _default(field: dataclasses.Field, declaration: Setting) -> str:
    if declaration.scorer_default:
        own = [
            f"{name} {_value(getattr(scorer, declaration.scorer_default))}"
            for name in registry.SERVICES
            if (scorer := registry.load_scorer_class(name)).batched
        ]
        return f"each service's own: {', '.join(own)}"
    if declaration.shown_default:
        return declaration.shown_default
    if field.default is None or field.default == "":
        return "unset" if field.default is None else "empty"
    return f"`{_value(field.default)}`"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m common.setup.settings_docs",
        description="Rewrite the docs' settings tables from the settings' declarations.",
    )
    parser.add_argument(
        "pages",
        nargs="*",
        type=Path,
        help="the pages to rewrite (default: every page of docs/ and services/*/README.md with markers)",
    )
    parser.add_argument("--print", action="store_true", help="print every table instead")
    args = parser.parse_args(argv)
    if args.print:
        print(tables())
        return 0
    for page in args.pages or pages():
        page.write_text(render(page.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
