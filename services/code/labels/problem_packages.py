"""Contest problem packages a label names (``{"problem": NAME}``): Kattis problemtools' layout,
read from the node's ``SCORER_CODE_PROBLEMS_DIR`` once and kept.

A package ``NAME/`` holds ``problem.yaml`` (the legacy format: ``validation: default``,
``custom`` or ``custom interactive``; 2023-07 and later: ``type: pass-fail`` or
``interactive``, or both, a custom output validator when the package has one, the default
validator's flags as ``output_validator_args`` of ``data/test_group.yaml``),
``data/sample`` and ``data/secret`` (``*.in`` each with its ``*.ans``, in subdirectories too,
judged sample first, each sorted by path as Kattis sorts them) and its output validator's
source (``output_validators/<name>/`` or ``output_validator/``: one C++ or Python file, C++
headers beside it put in place of their ``#include "..."``). The validator judges as Kattis
runs it (``validator input answer feedback_dir < output``, exit 42 accepted, 43 rejected); an
interactive problem's is the tests' interactor; default validation is Kattis' default
validator (``kattis_default``) with its flags. Anything else a package holds
(``input_validators``, statements, submissions) is not read. ``space_change_sensitive``, a
custom validator's flags, a test group's own flags, scoring, multi-pass and submit-answer
problems are refused on load, naming what is not served: they would be judged otherwise than
Kattis judges them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from common.limits.errors import Unprocessable
from services.code.judging import interactor
from services.code.judging.checkers import KATTIS_DEFAULT, Checker, parse_checker
from services.code.labels.suites import Suite

# A problem's name: Kattis' short names, nothing a path could be made of.
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}", re.IGNORECASE)
VALIDATIONS = {"custom": False, "custom interactive": True}
# The problem types (2023-07 and later) judged here.
SERVED_TYPES = ("pass-fail", "interactive")
VALIDATOR_DIRS = ("output_validators", "output_validator")
GROUP_SETTINGS = ("test_group.yaml", "testdata.yaml")  # 2025-09's name, 2023-07's
# Kattis' default output validator's tolerance flags (``space_change_sensitive`` is not served).
TOLERANCES = {"float_absolute_tolerance": ("abs_tol",), "float_relative_tolerance": ("rel_tol",),
              "float_tolerance": ("abs_tol", "rel_tol")}  # fmt: skip
SOURCES = {".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".py": "python"}
HEADERS = (".h", ".hpp", ".hh")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"/]+)"[^\n]*$', re.MULTILINE)


class Problems:
    """The packages under ``root``, each loaded (and validated) on its first label, then kept."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()
        self._loaded: dict[str, Suite] = {}
        self._lock = threading.Lock()

    def suite(self, name: Any) -> Suite:
        """The tests of problem ``name``; ``Unprocessable`` naming what is wrong otherwise."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise Unprocessable("labels: 'problem' is a problem's name (letters, digits, '_' and '-')")
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = load(self.root, name)
            return self._loaded[name]


def load(root: Path, name: str) -> Suite:
    """The package ``root/name`` as a ``Suite``; ``Unprocessable`` when it is missing or invalid."""
    package = root / name
    if not package.is_dir() or package.resolve().parent != root:
        raise Unprocessable(f"labels: no problem {name!r} on this node")
    config = _config(package, name)
    validation, flags = _validation(config, package, name)
    if validation != "default" and validation not in VALIDATIONS:
        raise Unprocessable(
            f"problem {name!r}: validation {str(validation)[:40]!r} is not judged here (only 'default', 'custom' "
            "and 'custom interactive')"
        )
    if flags and validation != "default":
        raise Unprocessable(f"problem {name!r}: validator_flags are not passed to custom validators here")
    try:
        inputs, answers = _tests(package, name)
        if validation == "default":
            return Suite("stdin", inputs, answers, checker=default_validator(flags, name))
        validator = parse_checker({**_validator(package, name), "protocol": "kattis"})
    except (OSError, UnicodeDecodeError) as exc:
        raise Unprocessable(f"problem {name!r} does not read: {str(exc)[:200]}") from None
    if VALIDATIONS[validation]:
        return Suite("stdin", inputs, answers, interactor=validator)
    return Suite("stdin", inputs, answers, checker=validator)


def _validation(config: dict[str, Any], package: Path, name: str) -> tuple[Any, Any]:
    """The package's legacy ``validation`` and its default validator's flags: its
    ``problem.yaml``'s own in the legacy format; in 2023-07 and later, from its ``type``,
    whether it has an output validator, and ``data/``'s group settings."""
    version = str(config.get("problem_format_version", "legacy"))
    if "type" not in config and version.startswith("legacy"):
        return config.get("validation", "default"), config.get("validator_flags") or ""
    if "validation" in config:
        raise Unprocessable(f"problem {name!r}: 'validation' is the legacy format's (2023-07 and later: 'type')")
    types = config.get("type", "pass-fail")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not types or not all(isinstance(t, str) for t in types):
        raise Unprocessable(f"problem {name!r}: type is a problem type or a list of them")
    unserved = [str(t)[:40] for t in types if t not in SERVED_TYPES]
    if unserved:
        raise Unprocessable(
            f"problem {name!r}: type {', '.join(unserved)} is not judged here (only {' and '.join(SERVED_TYPES)})"
        )
    flags = _group_flags(package, name)
    if "interactive" in types:
        return "custom interactive", flags
    return ("custom" if any((package / d).is_dir() for d in VALIDATOR_DIRS) else "default"), flags


def _group_flags(package: Path, name: str) -> Any:
    """``output_validator_args`` of ``data/``'s own group settings (every test's); those of a
    group within it are refused: its tests would be judged otherwise than the others."""
    flags: Any = ""
    for path in sorted((package / "data").rglob("*.yaml")):
        if path.name not in GROUP_SETTINGS:
            continue
        try:
            settings = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise Unprocessable(f"problem {name!r}: {path.name} does not read: {str(exc)[:200]}") from None
        if not isinstance(settings, dict) or "output_validator_args" not in settings:
            continue
        if path.parent != package / "data":
            raise Unprocessable(
                f"problem {name!r}: output_validator_args of {path.relative_to(package)} are not judged here "
                "(only data/'s own)"
            )
        args = settings["output_validator_args"]
        flags = " ".join(map(str, args)) if isinstance(args, list) else args
    return flags


def default_validator(flags: Any, name: str) -> Checker:
    """Kattis' default validator with ``flags`` (``validator_flags``) as a checker."""
    words = flags.split() if isinstance(flags, str) else None
    checker = Checker(mode=KATTIS_DEFAULT, abs_tol=-1.0, rel_tol=-1.0)
    while words:
        flag = words.pop(0)
        if flag == "case_sensitive":
            checker = dataclasses.replace(checker, case_sensitive=True)
            continue
        if flag not in TOLERANCES or not words:
            raise Unprocessable(
                f"problem {name!r}: validator_flags {str(flags)[:80]!r} are not judged here (case_sensitive, "
                f"{', '.join(f'{t} EPS' for t in TOLERANCES)})"
            )
        try:
            tolerance = float(words.pop(0))
        except ValueError:
            tolerance = math.nan
        if not math.isfinite(tolerance):
            raise Unprocessable(f"problem {name!r}: {flag} needs a finite number")
        checker = dataclasses.replace(checker, **dict.fromkeys(TOLERANCES[flag], tolerance))
    if words is None:
        raise Unprocessable(f"problem {name!r}: validator_flags must be text")
    return checker


def _config(package: Path, name: str) -> dict[str, Any]:
    path = package / "problem.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise Unprocessable(f"problem {name!r}: problem.yaml does not read: {str(exc)[:200]}") from None
    if not isinstance(config, dict):
        raise Unprocessable(f"problem {name!r}: problem.yaml is missing or not a mapping")
    return config


def _validator(package: Path, name: str) -> dict[str, str]:
    """The output validator's ``{"program", "language"}``."""
    found = [package / d for d in VALIDATOR_DIRS if (package / d).is_dir()]
    if len(found) != 1:
        raise Unprocessable(f"problem {name!r}: one output_validators/ (or output_validator/) directory expected")
    directory = found[0]
    below = [path for path in directory.iterdir() if path.is_dir()]
    if len(below) == 1 and not any(path.is_file() for path in directory.iterdir()):
        directory = below[0]
    files = {path.name: path for path in directory.iterdir() if path.is_file() and not path.is_symlink()}
    sources = [path for path in files.values() if path.suffix in SOURCES]
    if len(sources) != 1 or any(p.suffix not in (*SOURCES, *HEADERS) for p in files.values()):
        raise Unprocessable(
            f"problem {name!r}: its output validator must be one C++ or Python source (C++ headers beside it)"
        )
    source, language = sources[0], SOURCES[sources[0].suffix]
    program = source.read_text(encoding="utf-8")
    if language == "cpp":
        headers = {n: p.read_text(encoding="utf-8") for n, p in files.items() if p.suffix in HEADERS}
        program = _INCLUDE.sub(lambda m: headers.get(m.group(1), m.group(0)), program)
    return {"program": program, "language": language}


def _tests(package: Path, name: str) -> tuple[list[str], list[str]]:
    """Each test's input and answer: ``data/sample`` then ``data/secret``, each sorted by path."""
    inputs, answers = [], []
    for group in ("sample", "secret"):
        directory = package / "data" / group
        for path in sorted(directory.rglob("*.in")) if directory.is_dir() else ():
            answer = path.with_suffix(".ans")
            if path.is_symlink() or not answer.is_file():
                raise Unprocessable(f"problem {name!r}: {path.relative_to(package)} has no .ans beside it")
            inputs.append(path.read_text(encoding="utf-8"))
            answers.append(answer.read_text(encoding="utf-8"))
    if not 0 < len(inputs) <= interactor.MAX_TESTS:
        raise Unprocessable(f"problem {name!r}: data/ holds 1 to {interactor.MAX_TESTS} tests (*.in with *.ans)")
    return inputs, answers
