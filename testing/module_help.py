"""Many ``python -m MODULE ARGS`` commands run in turn in one interpreter, each as ``-m`` runs it
(``runpy``, ``sys.argv`` set), its exit status, stdout and stderr kept apart: the docs' commands
checked with ``--help`` appended import torch and transformers once, not once a command.

``python -m testing.module_help RESULTS < COMMANDS``: COMMANDS is a JSON list of argument lists
(the module, then its arguments); RESULTS gets a JSON list of ``{"code", "stdout", "stderr"}``,
one per command in order (written to a file: a module may write to the process's stdout)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback
from pathlib import Path


def exit_code(stop: SystemExit, stderr: io.StringIO) -> int:
    """The status ``sys.exit(code)`` gives the process: None is 0, a message is printed and 1."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=stderr)
    return 1


def run_module(argv: list[str]) -> dict[str, object]:
    """Runs ``python -m argv[0] argv[1:]`` here; a module that is not there, or raises, fails
    with its traceback, as the interpreter would. The environment and ``sys.path`` it changes are
    put back for the next."""
    stdout, stderr = io.StringIO(), io.StringIO()
    saved, environ, path = sys.argv, dict(os.environ), list(sys.path)
    sys.argv = list(argv)  # runpy sets argv[0] to the module's file
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as stop:
                code = exit_code(stop, stderr)
            except BaseException:  # the command's failure, reported as the interpreter would
                traceback.print_exc(file=stderr)
                code = 1
    finally:
        sys.argv, sys.path[:] = saved, path
        os.environ.clear()
        os.environ.update(environ)
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def main() -> None:
    commands = json.load(sys.stdin)
    Path(sys.argv[1]).write_text(json.dumps([run_module(argv) for argv in commands]))


if __name__ == "__main__":
    main()
