"""docs/settings.md's tables, made from the settings' declarations (``common.config.setting``):
every setting of the core and of each service, its variable, flag, default and help.

``python -m common.settings_docs docs/settings.md`` rewrites the part of the page between its
markers (in an environment with every service's packages: the batching defaults are the scorer
classes'); without a path it prints the tables.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from common import registry
from common.config import Setting, declared, env_name
from common.settings import CoreSettings

START = "<!-- settings:start -->"
END = "<!-- settings:end -->"
HEADER = "| variable | flag | default | meaning |\n|---|---|---|---|"


def tables() -> str:
    """The core's table, then one per service with settings of its own, in registry order."""
    sections = [f"## Every service (`SCORER_*`)\n\n{_table(CoreSettings, '')}"]
    for name in registry.SERVICES:
        own = registry.settings_class(name)
        if own is not None:
            sections.append(f"## {name} (`SCORER_{name.upper()}_*`)\n\n{_table(own, name)}")
    return "\n\n".join(sections)


def render(page: str) -> str:
    """``page`` with the tables between its markers replaced by the current ones."""
    before, start, rest = page.partition(START)
    _, end, after = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the page has no {START} ... {END} pair")
    return f"{before}{START}\n{tables()}\n{END}{after}"


def _table(cls: type, section: str) -> str:
    rows = [HEADER]
    for field in dataclasses.fields(cls):
        declaration = declared(field)
        if declaration is None:
            raise ValueError(f"{cls.__name__}.{field.name} is not declared with common.config.setting")
        variable = f"`{env_name(section, field.name)}`"
        if declaration.renamed_from:
            former = env_name(section, declaration.renamed_from)
            variable += f" (formerly `{former}`, still read until the next release)"
        flag = f"`--{field.name.replace('_', '-')}`" if declaration.flag else ""
        rows.append(f"| {variable} | {flag} | {_default(field, declaration)} | {declaration.help} |")
    return "\n".join(rows)


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
    if not argv:
        print(tables())
        return 0
    page = Path(argv[0])
    page.write_text(render(page.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
