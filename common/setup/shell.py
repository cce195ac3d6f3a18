"""What ``run.sh`` reads, as shell assignments for ``eval``: the services (``names``), what a
command installs (``shell``), the flags it takes (``flags``; ``usage`` for ``--help``); and
whether the settings it starts with can be used (``check``: one line naming a bad one, no
traceback). Standard library only, as
``run.sh`` runs it with the system python3 before any virtual environment exists."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping

from common.configuration.config import PREFIX, declared, env_name, flags, from_env
from common.configuration.devices import GPU_ENV
from common.configuration.settings import CoreSettings
from common.setup.install import (
    GO_BUILD_ENV,
    GO_COMMAND,
    GO_REQUIREMENTS,
    known_packages,
    setup_of,
)
from common.setup.registry import SERVICES, get, read_settings, settings_class


def shell(command: str) -> str:
    """``setup_of(command)`` as shell assignments for ``eval`` (tuples become bash arrays), plus
    ``SYSTEM_COMMANDS``: the command that shows each system package installed, and
    ``SYSTEM_COMMAND_DIRS``: where it must be (empty: on PATH or in the sbin directories),
    ``SYSTEM_COMMAND_MINIMUM``: its oldest version that counts (empty: any), and the pinned Go's
    ``GO_REQUIREMENTS``, ``GO_COMMAND`` and ``GO_BUILD_ENV`` (``NAME=VALUE`` items)."""
    setup = setup_of(command)
    lines = []
    for item in dataclasses.fields(setup):
        value = getattr(setup, item.name)
        if isinstance(value, tuple):
            lines.append(f"{item.name.upper()}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{item.name.upper()}={shlex.quote(str(value))}")
    known = known_packages()
    packages = [known[name] for name in setup.system_packages]
    lines.append(f"SYSTEM_COMMANDS=({' '.join(p.command for p in packages)})")
    lines.append(f"SYSTEM_COMMAND_DIRS=({' '.join(shlex.quote(p.dirs) for p in packages)})")
    lines.append(f"SYSTEM_COMMAND_MINIMUM=({' '.join(shlex.quote(p.minimum) for p in packages)})")
    lines.append(f"GO_REQUIREMENTS={shlex.quote(GO_REQUIREMENTS)} GO_COMMAND={shlex.quote(GO_COMMAND)}")
    lines.append(f"GO_BUILD_ENV=({' '.join(shlex.quote(f'{k}={v}') for k, v in GO_BUILD_ENV.items())})")
    for manager in ("dnf", "apk"):
        names = (p.other_names.get(manager, p.name) for p in packages)
        lines.append(f"SYSTEM_PACKAGES_{manager.upper()}=({' '.join(names)})")
    return "\n".join(lines)


def flag_variables(command: str) -> tuple[str, ...]:
    """``--flag=VARIABLE`` for each flag ``run.sh <command>`` takes: the core's, then those its
    service declares in its own settings (``Setting.flag``); ``all``: every service's."""
    names = list(SERVICES) if command == "all" else [get(command).name]
    pairs = flags(CoreSettings)
    for name in names:
        own = settings_class(name)
        pairs += flags(own, name) if own else []
    return tuple(f"{flag}={variable}" for flag, variable in pairs)


def flags_shell(command: str) -> str:
    """The flags ``run.sh <command>`` takes, as a ``FLAGS`` bash array (read before the flags
    set anything: the ``multi`` service's set-up needs its ``--rewards`` first)."""
    return f"FLAGS=({' '.join(shlex.quote(f) for f in flag_variables(command))})"


def usage(command: str) -> str:
    """The flags ``run.sh <command>`` takes (``all``: each service's), one a line with the
    variable it sets and its help, for ``--help``."""
    names = list(SERVICES) if command == "all" else [get(command).name]
    blocks = [_flag_lines("every service", CoreSettings, "")]
    blocks += [_flag_lines(name, own, name) for name in names if (own := settings_class(name)) and flags(own, name)]
    return "\n".join(["Flags (each sets the variable shown; docs/settings.md lists every setting):", *blocks])


def _flag_lines(title: str, cls: type, section: str) -> str:
    lines = [f"  {title}:"]
    for field in dataclasses.fields(cls):
        declaration = declared(field)
        if declaration and declaration.flag:
            flag = f"--{field.name.replace('_', '-')}"
            lines.append(f"    {flag:<24} {env_name(section, field.name):<34} {declaration.help}")
    return "\n".join(lines)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``SCORER_*`` variables of ``environ`` that no service reads: a misspelt setting
    would otherwise leave its default in force without a word (the tests' and the per-worker
    GPU variable are no settings)."""
    sections = [("", CoreSettings), *((name, settings_class(name)) for name in SERVICES)]
    known = {
        env_name(section, name)
        for section, cls in sections
        if cls
        for field in dataclasses.fields(cls)
        for name in (field.name, getattr(declared(field), "renamed_from", ""))
        if name
    }
    return sorted(
        name
        for name in environ
        if name.startswith(PREFIX) and name not in known | {GPU_ENV} and not name.startswith(f"{PREFIX}TEST_")
    )


def check(command: str) -> None:
    """Nothing when the settings ``run.sh <command>`` starts with can be read: the core's and
    the service's own (``multi``: each listed reward's too), as the service will read them;
    else ``ConfigError``, one line naming the variable. ``all`` checks the core's only: a
    service whose own settings cannot be used is skipped by its preflight, the others start. A
    ``SCORER_*`` variable no service reads is warned of on stderr (``unknown_variables``)."""
    for name in unknown_variables(os.environ):
        print(f"warning: {name} is no setting of any service (docs/settings.md lists them): ignored", file=sys.stderr)
    from_env(CoreSettings)
    if command != "all":
        read_settings(command)


def main(argv: list[str]) -> int:
    """``names``: the services, one a line; ``shell <command>``: what run.sh sets up for it;
    ``flags <command>``: the flags it takes, ``usage <command>`` with their help; ``check
    <command>``: its settings are usable."""
    if argv == ["names"]:
        print("\n".join(SERVICES))
        return 0
    if len(argv) == 2 and argv[0] in ("shell", "flags", "usage", "check"):
        try:
            if argv[0] == "check":
                check(argv[1])
            else:
                print({"shell": shell, "flags": flags_shell, "usage": usage}[argv[0]](argv[1]))
        except ValueError as exc:  # an unknown service, a setting's bad value (ConfigError)
            print(exc, file=sys.stderr)
            return 2
        return 0
    print(
        "usage: python3 -m common.setup.shell names | shell|flags|usage|check <service|all> (shell: test too)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
