"""Named environments: classic problems of our own, for labels that carry no tests.

Each module here holds a problem: ``STATEMENT`` (what the model is asked), ``REFERENCE`` (a
solution, as source), ``FN_NAME`` (the function to call, ``""`` for a stdin program) and
``cases(rng)`` (the generated test inputs). The expected outputs are the reference's answers,
computed here in the service from our own trusted code. A server serves one environment
(``SCORER_CODE_ENV``), like DeepGym's router.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import pkgutil
import random
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from services.code.labels.suites import Suite


@dataclass(frozen=True)
class Environment:
    name: str
    statement: str
    reference: str
    suite: Suite


def names() -> list[str]:
    """Every shipped environment."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _run_stdin(code: Any, text: str) -> str:
    out = io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, {"__name__": "__main__"})
    finally:
        sys.stdin = saved
    return out.getvalue()


@cache
def load(name: str) -> Environment:
    """Build environment ``name``: generate its tests and answer them with the reference."""
    if name not in names():
        raise KeyError(f"unknown environment {name!r}; choose one of {', '.join(names())}")
    module = importlib.import_module(f"{__name__}.{name}")
    code = compile(module.REFERENCE, f"<reference {name}>", "exec")
    inputs = module.cases(random.Random(name))
    if module.FN_NAME:
        namespace: dict[str, Any] = {}
        exec(code, namespace)
        outputs = [namespace[module.FN_NAME](*copy.deepcopy(args)) for args in inputs]
        suite = Suite("call", inputs, outputs, fn_name=module.FN_NAME)
    else:
        suite = Suite("stdin", inputs, [_run_stdin(code, text) for text in inputs])
    return Environment(name, module.STATEMENT.strip(), module.REFERENCE, suite)
