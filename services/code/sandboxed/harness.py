"""The bodies of the processes that run a program or a label's code (they trust nothing).

- ``run_stdin_program``: a stdin test's process runs the program on its stdin;
- ``serve_calls``: the candidate's process loads the program and answers calls as plain data;
- ``run_tests``: the tests' process runs an assert label's code, calling the candidate's
  functions through proxies.

Each is entered in a process ``confine.spawn`` made (its uid, limits and fds already set).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import io
import json
import os
import sys
import types
import typing

from services.code.sandboxed.wire import (
    ANSWERS_FD,
    CALLS_FD,
    LOADED,
    RESULT_FD,
    STDERR_TAIL,
    TESTER_IN_FD,
    TESTER_OUT_FD,
    TrustedTests,
    from_plain,
    to_plain,
)  # fmt: skip


def _line(out: typing.TextIO, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _fresh_std_streams() -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` over fds 0-2 (the ones this body was given), which
    stay open if the candidate closes the objects."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)))


def _compile_or_exit(code: str, out: typing.TextIO, report: typing.Callable[[str], object]) -> types.CodeType:
    """The candidate's code compiled; a compile error is written to ``out`` as ``report(message)``
    and ends the process."""
    try:
        return compile(code, "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        _line(out, report(f"{type(exc).__name__}: {exc}"))
        os._exit(0)


def _describe(namespace: dict, names: list) -> dict:
    """What the candidate's namespace holds under ``names``: callables, modules, plain values."""
    found: dict = {}
    for name in names:
        if not isinstance(name, str) or name not in namespace:
            continue
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            found[name] = ["module", value.__name__]
        elif callable(value):
            found[name] = ["callable"]
        else:
            with contextlib.suppress(Exception):
                to_plain(value)
                found[name] = ["value", value]
    return found


def _resolve(namespace: dict, name: str, instances: dict) -> typing.Callable:
    """The candidate's function ``name``, or that method of a LeetCode-style ``Solution``."""
    if callable(namespace.get(name)):
        return namespace[name]
    if "Solution" in namespace:
        if "Solution" not in instances:
            instances["Solution"] = namespace["Solution"]()
        method = getattr(instances["Solution"], name, None)
        if callable(method):
            return method
    raise NameError(f"function {name!r} is not defined")


def serve_calls(source: str) -> None:
    """Body of the candidate's process: run the code, then answer each call from fd 3 on fd 4.

    A call is a line ``["call", name, args, kwargs]`` or ``["describe", names]`` in plain data.
    First line out: ``["loaded"]`` or ``["compile_error", message]``; then one per call:
    ``["result", value]`` or ``["error", exception type, message]``. Everything here is the
    candidate's to tamper with: it decides only what it answers.
    """
    calls = os.fdopen(CALLS_FD, "rb", buffering=1 << 16)
    out = os.fdopen(ANSWERS_FD, "w", closefd=True)
    _fresh_std_streams()
    code = _compile_or_exit(source, out, lambda message: ["compile_error", message])
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(code, namespace)
        out.write(LOADED.decode())
        out.flush()
        instances: dict = {}
        for request in calls:
            try:
                verb, *call = from_plain(request)
                if verb == "describe":
                    result = _describe(namespace, call[0])
                else:
                    name, args, kwargs = call
                    result = _resolve(namespace, name, instances)(*args, **kwargs)
                text = json.dumps(["result", to_plain(result)])
            except BaseException as exc:  # the candidate's error is this call's answer
                text = json.dumps(["error", type(exc).__name__, str(exc)[:STDERR_TAIL]])
            out.write(text + "\n")
            out.flush()
    except BaseException as exc:  # its code failed to load (or left): every later call fails
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(1)


# -- the tests' process: the label's trusted code, calling the candidate through proxies -----
# Exceptions a candidate's error may be re-raised as in the tests (by name); any other is a
# CandidateError. StopIteration and its kin never are: raised into a test's loop they would
# end it early, unchecked.
RAISABLE = (
    "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError", "MemoryError",
    "NameError", "NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "TypeError",
    "UnboundLocalError", "ValueError", "ZeroDivisionError",
)  # fmt: skip


class CandidateError(Exception):
    """A call of the candidate failed: it raised, died, ran out of time or returned non-data."""


def _bound_names(tree: ast.AST) -> set:
    """Every name the trusted code binds anywhere (assigned, defined, imported, a parameter)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound


class Candidate:
    """The tests' side of the calls: a request line out on fd 3, its answer in on fd 4."""

    def __init__(self) -> None:
        self.out = os.fdopen(TESTER_OUT_FD, "wb", buffering=0)
        self.answers = os.fdopen(TESTER_IN_FD, "rb", buffering=1 << 16)

    def ask(self, request: list) -> object:
        """Send a call, wait for its answer: the value, rebuilt here; or an exception raised."""
        self.out.write(b"C" + json.dumps(to_plain(request)).encode() + b"\n")
        line = self.answers.readline()
        try:
            answer = from_plain(line)
        except (ValueError, TypeError, RecursionError, MemoryError):
            answer = None
        if not isinstance(answer, list) or not answer:
            raise CandidateError("the candidate answered something that is not plain data")
        if answer[0] == "result" and len(answer) == 2:
            return answer[1]
        error = str(answer[1]) if answer[0] == "error" and len(answer) > 1 else "CandidateError"
        exception = getattr(builtins, error) if error in RAISABLE else CandidateError
        raise exception(f"{error} in the candidate: {answer[2:]}"[:STDERR_TAIL])

    def proxy(self, name: str) -> typing.Callable:
        def call(*args: object, **kwargs: object) -> object:
            return self.ask(["call", name, list(args), kwargs])

        call.__name__ = call.__qualname__ = name
        return call

    def report(self, index: int, error: str | None) -> None:
        report = {"index": index, "passed": True} if error is None else {"index": index, "error": error}
        self.out.write(b"R" + json.dumps(report).encode() + b"\n")


def _candidate_names(candidate: Candidate, namespace: dict, free: set) -> None:
    """Bind the names the tests take from the candidate: its callables as proxies, its stdlib
    modules imported here, its plain values as copies. Nothing the trusted code binds itself."""
    found = candidate.ask(["describe", sorted(free)])
    if not isinstance(found, dict):
        raise CandidateError("the candidate described its names in something that is not plain data")
    for name, (kind, *value) in ((n, v) for n, v in found.items() if n in free and isinstance(v, list) and v):
        if kind == "callable":
            namespace[name] = candidate.proxy(name)
        elif kind == "module" and value == [name] and name in sys.stdlib_module_names:  # its own `import name`
            namespace[name] = importlib.import_module(name)
        elif kind == "value" and value:
            namespace[name] = value[0]


def run_tests(trusted: TrustedTests) -> None:
    """Body of the tests' process: the label's setup and tests, a report line per test.

    Runs as a uid of its own, so the candidate's process can neither signal, trace nor read
    it; its reports go to the supervisor on a pipe only it holds.
    """
    candidate = Candidate()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    entry = trusted.entry_point
    try:
        setup = ast.parse(trusted.setup, "<setup>")
        tests = [ast.parse(test, "<tests>") for test in trusted.tests]
        exec(compile(setup, "<setup>", "exec"), namespace)
        loads = {node.id for tree in (setup, *tests) for node in ast.walk(tree) if isinstance(node, ast.Name)}
        bound = set().union(*map(_bound_names, (setup, *tests)), dir(builtins), namespace)
        free = (loads - bound) | ({entry} if entry else set())
        _candidate_names(candidate, namespace, free)
        if entry:  # always the candidate's, never a stub the setup (a prompt) defined
            namespace[entry] = candidate.proxy(entry)
    except BaseException as exc:  # the candidate failed to load, or the label's setup failed
        for index in range(len(trusted.tests)):
            candidate.report(index, type(exc).__name__)
        return
    for index in range(len(tests)):
        error = None
        try:
            namespace.pop("check", None)
            exec(compile(tests[index], "<tests>", "exec"), namespace)
            if entry and callable(namespace.get("check")):
                namespace["check"](namespace[entry])
        except BaseException as exc:  # the test's verdict
            error = type(exc).__name__
        candidate.report(index, error)


def run_stdin_program(source: str) -> None:
    """Body of a stdin test process: compile (a compile error is the one thing reported on
    fd 3, which is closed before the program runs: nothing it writes counts but its stdout), run."""
    out = os.fdopen(RESULT_FD, "w", closefd=True)
    _fresh_std_streams()
    code = _compile_or_exit(source, out, lambda message: {"compile_error": message})
    out.close()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    status = 0
    try:
        exec(code, namespace)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the model's error is its verdict
        status = 1
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(status)
