"""The packages graded programs may import beyond the standard library (``sandbox_packages``).

They live in a directory of their own, ``.sandbox-packages/`` in the checkout, installed by
``run.sh`` (``python -m services.code.packages``) with the service's interpreter, and the
sandbox shows programs that directory alone, read-only, at ``SANDBOX_PATH`` (never the rest of
the checkout). Standard library only: ``run.sh`` runs it before the service starts.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common.configuration.config import from_env
from services.code.settings import CodeSettings

PACKAGES_DIR = Path(__file__).resolve().parents[2] / ".sandbox-packages"
# Where programs find them under bubblewrap.
SANDBOX_PATH = "/sandbox-packages"
# The requirements the directory was installed from.
STAMP = ".requirements"


def requirements(spec: str) -> list[str]:
    """The pip requirements of a ``sandbox_packages`` setting (separated by spaces or commas)."""
    return [item for item in re.split(r"[\s,]+", spec) if item]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def missing(spec: str, directory: Path = PACKAGES_DIR) -> list[str]:
    """The requirements of ``spec`` not installed in ``directory`` (by name and ``==`` version)."""
    found = {}
    if directory.is_dir():
        for dist in importlib.metadata.distributions(path=[str(directory)]):
            found[dist.metadata["Name"].lower().replace("_", "-")] = dist.version
    absent = []
    for requirement in requirements(spec):
        pinned = requirement.partition("==")[2].strip()
        version = found.get(_name(requirement))
        if version is None or (pinned and version != pinned):
            absent.append(requirement)
    return absent


def top_level_modules(spec: str, directory: Path = PACKAGES_DIR) -> list[str]:
    """The importable top-level modules of the distributions ``spec`` names."""
    wanted = {_name(requirement) for requirement in requirements(spec)}
    modules: set[str] = set()
    for dist in importlib.metadata.distributions(path=[str(directory)]):
        if dist.metadata["Name"].lower().replace("_", "-") not in wanted:
            continue
        for file in dist.files or ():
            top = file.parts[0]
            if top.endswith((".dist-info", ".data", ".libs")) or top == "..":
                continue
            name = top.removesuffix(".py") if len(file.parts) == 1 else top
            if name.isidentifier() and (len(file.parts) > 1 or top.endswith(".py")):
                modules.add(name)
    return sorted(modules)


def install(spec: str, directory: Path = PACKAGES_DIR) -> bool:
    """Install ``spec`` into ``directory`` unless it already holds it; True if it installed.

    Installed beside it first and then swapped in, so a half-done install is never used.
    """
    stamp = directory / STAMP
    if not missing(spec, directory) and stamp.is_file() and stamp.read_text() == spec:
        return False
    fresh = directory.with_name(f"{directory.name}.new-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    wanted = requirements(spec)
    if wanted:
        # Compiled here (the sandbox's copy is read-only), for this interpreter.
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts"]
        subprocess.run([*pip, "--target", str(fresh), *wanted], check=True)
    (fresh / STAMP).write_text(spec)
    os.chmod(fresh, 0o755)
    old = directory.with_name(f"{directory.name}.old-{os.getpid()}")
    if directory.exists():
        directory.rename(old)
    fresh.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return True


def main() -> int:
    spec = from_env(CodeSettings, "code").sandbox_packages
    if install(spec):
        print(f"[run.sh] code sandbox packages installed in {PACKAGES_DIR}: {spec or '(none)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
