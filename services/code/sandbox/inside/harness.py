"""The bodies of the processes that run a program or a label's code (they trust nothing).

- ``run_stdin_program``: a stdin test's process runs the program on its stdin;
- ``serve_calls``: the candidate's process loads the program and answers calls as plain data;
- ``run_tests``: the tests' process runs an assert label's code, calling the candidate's
  functions through proxies.

Each is entered in a process ``confine.spawn`` made (its uid, limits and fds already set),
and first made to look like a fresh ``python3`` (``_fresh_interpreter``): a program runs as
a judge's CPython would run it, the stdin one as ``__main__`` ending as the interpreter ends,
the others as a module of their own (``PROGRAM_MODULE``), as HumanEval's and LiveCodeBench's
harnesses load them. What the tests' process observes of the program never depends on
whether an earlier answer was right (``_Observed``).
"""

from __future__ import annotations

import _sitebuiltins
import ast
import atexit
import builtins
import contextlib
import functools
import gc
import importlib
import io
import json
import os
import re
import sys
import types
import typing

from services.code.sandbox.inside.messages import (
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


# Call-based and assert programs are loaded as this module, registered in ``sys.modules``
# (pickle finds their functions); a stdin program is ``__main__``.
PROGRAM_MODULE = "solution"
# Each program runs its numeric libraries on one thread: its CPU limit is per process.
THREAD_VARIABLES = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _fresh_interpreter() -> None:
    """What a fresh ``python3 solution.py`` has and the zygote (``-I -S``) lacks: new
    ``sys.stdin``/``stdout``/``stderr`` over fds 0-2 (which stay open if the program closes
    the objects), ``exit``/``quit``/``help``, no exit handlers, ``sys.argv``; integers
    printed and parsed at any length, as before CPython 3.11 (the program's own CPU time)."""
    sys.stdin = sys.__stdin__ = _std_stream(0, "r", "<stdin>")
    sys.stdout = sys.__stdout__ = _std_stream(1, "w", "<stdout>")
    sys.stderr = sys.__stderr__ = _std_stream(2, "w", "<stderr>", errors="backslashreplace", line_buffering=True)
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()
    atexit._clear()
    sys.argv = ["solution.py"]
    sys.set_int_max_str_digits(0)
    os.environ.update(THREAD_VARIABLES)


def _std_stream(fd: int, mode: str, name: str, errors: str = "strict", line_buffering: bool = False) -> typing.TextIO:
    """A standard stream as CPython makes it (``name``, ``mode``, UTF-8), over ``fd``, which
    stays open if the program closes the object. (Templates such as PyRival's FastIO read
    ``sys.stdout.mode``.)"""
    raw = io.FileIO(fd, mode, closefd=False)
    raw.name = name  # type: ignore[misc]
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    stream = io.TextIOWrapper(buffered, encoding="utf-8", errors=errors, line_buffering=line_buffering)
    stream.mode = mode  # type: ignore[misc]
    return stream


def _program_module(name: str) -> types.ModuleType:
    """An empty module ``name`` for the program to run in, registered as ``sys.modules[name]``."""
    module = types.ModuleType(name)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module


def _finalize(module: types.ModuleType) -> None:
    """End as CPython ends after its main module: join the threads that are not daemons, run
    the exit handlers, flush ``sys.stdout``/``stderr``, clear the program's module (its
    objects' finalizers run) and flush every file object still open."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush(sys.stdout, sys.stderr)
    with contextlib.suppress(BaseException):
        module.__dict__.clear()
        gc.collect()
    _flush(*(obj for obj in gc.get_objects() if isinstance(obj, io.IOBase)), sys.stdout, sys.stderr)


def _flush(*streams: object) -> None:
    for stream in streams:
        with contextlib.suppress(BaseException):
            if not stream.closed:  # type: ignore[attr-defined]
                stream.flush()  # type: ignore[attr-defined]


def _compile_or_exit(code: str, out: typing.TextIO, report: typing.Callable[[str], object]) -> types.CodeType:
    """The candidate's code compiled; a compile error is written to ``out`` as ``report(message)``
    and ends the process."""
    try:
        return compile(code, "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        _line(out, report(f"{type(exc).__name__}: {exc}"))
        os._exit(0)


def _run_prelude(prelude: str, namespace: dict) -> dict:
    """Run a label's import block (``preludes``) in the program's namespace before the program,
    compiled apart (the program's line numbers and ``from __future__`` stay its own); returns
    what it bound, which the program may replace."""
    if not prelude:
        return {}
    exec(compile(prelude, "<prelude>", "exec"), namespace)
    return dict(namespace)


def _programs(namespace: dict, given: dict, name: str) -> bool:
    """Whether the program bound ``name``: a name the prelude bound (``math.gcd`` as ``gcd``)
    and the program left is no function of the program's to call."""
    return name in namespace and not (name in given and namespace[name] is given[name])


def _describe(namespace: dict, names: list, given: dict) -> dict:
    """What the candidate's namespace holds under ``names``: callables, modules, plain values
    (of the prelude's, only modules: the tests' process imports them itself)."""
    found: dict = {}
    for name in names:
        if not isinstance(name, str) or name not in namespace:
            continue
        value = namespace[name]
        if not _programs(namespace, given, name) and not isinstance(value, types.ModuleType):
            continue
        if isinstance(value, types.ModuleType):
            found[name] = ["module", value.__name__]
        elif callable(value):
            found[name] = ["callable"]
        else:
            with contextlib.suppress(Exception):
                to_plain(value)
                found[name] = ["value", value]
    return found


def _resolve(namespace: dict, name: str, instances: dict, given: dict) -> typing.Callable:
    """The candidate's function ``name``, or that method of a LeetCode-style ``Solution``."""
    if _programs(namespace, given, name) and callable(namespace[name]):
        return namespace[name]
    if _programs(namespace, given, "Solution"):
        if "Solution" not in instances:
            instances["Solution"] = namespace["Solution"]()
        method = getattr(instances["Solution"], name, None)
        if callable(method):
            return method
    raise NameError(f"function {name!r} is not defined")


def serve_calls(source: str, prelude: str = "") -> None:
    """Body of the candidate's process: run the code, then answer each call from fd 3 on fd 4.

    A call is a line ``["call", name, args, kwargs]`` or ``["describe", names]`` in plain data.
    First line out: ``["loaded"]`` or ``["compile_error", message]``; then one per call:
    ``["result", value]`` or ``["error", exception type, message]``. Everything here is the
    candidate's to tamper with: it decides only what it answers.
    """
    calls = os.fdopen(CALLS_FD, "rb", buffering=1 << 16)
    out = os.fdopen(ANSWERS_FD, "w", closefd=True)
    _fresh_interpreter()
    code = _compile_or_exit(source, out, lambda message: ["compile_error", message])
    namespace = _program_module(PROGRAM_MODULE).__dict__
    try:
        given = _run_prelude(prelude, namespace)
        exec(code, namespace)
        out.write(LOADED.decode())
        out.flush()
        instances: dict = {}
        for request in calls:
            try:
                verb, *call = from_plain(request)
                if verb == "describe":
                    result = _describe(namespace, call[0], given)
                else:
                    name, args, kwargs = call
                    result = _resolve(namespace, name, instances, given)(*args, **kwargs)
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


# Names the rewritten asserts use in the tests' namespace (no label binds a dunder of ours).
CHECK, ALL_OF, ANY_OF = "__harness_check__", "__harness_and__", "__harness_or__"


def _observed(statements: list[ast.stmt], plain: bool, handled: bool = False) -> list[ast.stmt]:
    """``statements`` with their asserts rewritten so that what the program sees (which calls
    come, in what order) never depends on whether an earlier answer was right:

    - an assert's message is never evaluated (HumanEval/95's messages call the program again);
    - a failed assert is recorded and the test goes on: every assert of it runs, and it fails
      as its first failed assert would have ended it (an assert inside a ``try`` that handles
      exceptions, ``handled``, still raises, as its handler may expect);
    - ``and``/``or`` in an assert evaluate every operand (their errors held until reached),
      so ``f(1) == 2 and f(2) == 4`` calls ``f(2)`` whatever ``f(1)`` answered; so do
      ``all`` and ``any`` in the tests (``_all``).

    Only statements are walked (asserts are statements), in place; an assert's expression
    only when the code is not ``plain`` (``_plain``). A class body is left as written (a
    lambda would not see its names).
    """
    for position, statement in enumerate(statements):
        if isinstance(statement, ast.Assert):
            statements[position] = _observed_assert(statement, plain, handled)
        elif isinstance(statement, (ast.Try, ast.TryStar)):
            _observed(statement.body, plain, handled or bool(statement.handlers))
            for block in (*(handler.body for handler in statement.handlers), statement.orelse, statement.finalbody):
                _observed(block, plain, handled)
        elif isinstance(statement, ast.Match):
            for case in statement.cases:
                _observed(case.body, plain, handled)
        elif not isinstance(statement, ast.ClassDef):
            for block in (getattr(statement, "body", None), getattr(statement, "orelse", None)):
                if isinstance(block, list):
                    _observed(block, plain, handled)
    return statements


# Code without these words has no and/or, walrus, await or yield in its asserts (words in its
# strings only cost a look at each assert's expression).
NOT_PLAIN = re.compile(r"\b(?:and|or|await|yield)\b|:=")


def _observed_assert(node: ast.Assert, plain: bool, handled: bool) -> ast.stmt:
    """``assert test`` without its message; unless ``handled``, as ``CHECK(lambda: test)``,
    which records a failure (``_check``) where the assert would have raised."""
    inner = [] if plain else list(ast.walk(node.test))
    test = _eager(node.test) if any(isinstance(item, ast.BoolOp) for item in inner) else node.test
    if handled or any(isinstance(item, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for item in inner):
        return ast.copy_location(ast.Assert(test=test, msg=None), node)  # a lambda would change what it binds
    return ast.copy_location(ast.Expr(_call(node, CHECK, _thunk(test, node))), node)


def _call(like: ast.AST, name: str, *args: ast.expr) -> ast.Call:
    """``name(*args)``, located at ``like``."""
    return ast.copy_location(ast.Call(ast.copy_location(ast.Name(name, ast.Load()), like), list(args), []), like)


def _thunk(value: ast.expr, like: ast.AST) -> ast.Lambda:
    """``lambda: value``, located at ``like``."""
    return ast.copy_location(ast.Lambda(ast.arguments([], [], None, [], [], None, []), value), like)


def _eager(node: ast.expr) -> ast.expr:
    """``a and b`` as ``ALL_OF(lambda: a, lambda: b)`` (``or``: ``ANY_OF``), nested ones too,
    unless an operand binds a name (a lambda would keep it)."""

    class Eager(ast.NodeTransformer):
        def visit_BoolOp(self, op: ast.BoolOp) -> ast.AST:
            op = self.generic_visit(op)  # type: ignore[assignment]
            if any(isinstance(inner, ast.NamedExpr) for value in op.values for inner in ast.walk(value)):
                return op
            return _call(op, ALL_OF if isinstance(op.op, ast.And) else ANY_OF, *(_thunk(v, v) for v in op.values))

    return Eager().visit(node)


def _check(failures: list[str], test: typing.Callable[[], object]) -> None:
    """A rewritten assert: a false ``test`` or its error is recorded (by name), not raised."""
    try:
        held = bool(test())
    except Exception as exc:
        failures.append(type(exc).__name__)
        return
    if not held:
        failures.append("AssertionError")


Outcomes = list[tuple[object, Exception | None]]


def _evaluate_all(thunks: tuple) -> Outcomes:
    """Each operand's value or the exception it raised, every one evaluated."""
    outcomes: Outcomes = []
    for thunk in thunks:
        try:
            outcomes.append((thunk(), None))
        except Exception as exc:
            outcomes.append((None, exc))
    return outcomes


def _every(iterable: typing.Iterable) -> Outcomes:
    """Every item of ``iterable`` (up to an error it raised, the last outcome)."""
    outcomes: Outcomes = []
    iterator = iter(iterable)
    while True:
        try:
            outcomes.append((next(iterator), None))
        except StopIteration:
            return outcomes
        except Exception as exc:
            return [*outcomes, (None, exc)]


def _fold(outcomes: Outcomes, stop_at: bool, otherwise: object) -> object:
    """What ``and`` (``stop_at`` False) or ``or`` (True) answers over values already taken:
    the first value whose truth is ``stop_at``, an error reached before it, else ``otherwise``
    (``None``: the last value)."""
    for value, error in outcomes:
        if error is not None:
            raise error
        if bool(value) is stop_at:
            return value
    return outcomes[-1][0] if otherwise is None and outcomes else otherwise


def _all_of(*thunks: typing.Callable[[], object]) -> object:
    return _fold(_evaluate_all(thunks), False, None)


def _any_of(*thunks: typing.Callable[[], object]) -> object:
    return _fold(_evaluate_all(thunks), True, None)


def _all(iterable: typing.Iterable) -> bool:
    """``all``, taking every item first (``all(f(x) == y for ...)`` calls ``f`` on each ``x``
    whatever it answered)."""
    return bool(_fold(_every(iterable), False, True))


def _any(iterable: typing.Iterable) -> bool:
    """``any``, taking every item first."""
    return bool(_fold(_every(iterable), True, False))


def run_tests(trusted: TrustedTests) -> None:
    """Body of the tests' process: the label's setup and tests, a report line per test.

    Runs as a uid of its own, so the candidate's process can neither signal, trace nor read
    it; its reports go to the supervisor on a pipe only it holds.
    """
    candidate = Candidate()
    failures: list[str] = []
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins, ALL_OF: _all_of, ANY_OF: _any_of}
    namespace.update(all=_all, any=_any)
    namespace[CHECK] = functools.partial(_check, failures)
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
    for index, tree in enumerate(tests):
        error = None
        failures.clear()
        # Only a check() this test defines is called (a program's own ``check`` may be a name
        # the tests take from it).
        defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body)
        try:
            tree.body = _observed(tree.body, plain=not NOT_PLAIN.search(trusted.tests[index]))
            exec(compile(tree, "<tests>", "exec"), namespace)
            if entry and defines_check and callable(namespace.get("check")):
                namespace["check"](namespace[entry])
        except BaseException as exc:  # the test's verdict
            error = type(exc).__name__
        candidate.report(index, failures[0] if failures else error)


def run_stdin_program(source: str, prelude: str = "") -> None:
    """Body of a stdin test process: compile (a compile error is the one thing reported on
    fd 3, which is closed before the program runs: nothing it writes counts but its stdout),
    run the prelude, run."""
    out = os.fdopen(RESULT_FD, "w", closefd=True)
    _fresh_interpreter()
    code = _compile_or_exit(source, out, lambda message: {"compile_error": message})
    out.close()
    module = _program_module("__main__")
    status = 0
    try:
        _run_prelude(prelude, module.__dict__)
        exec(code, module.__dict__)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the model's error is its verdict
        status = 1
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"\n{type(exc).__name__}: {exc}"[:STDERR_TAIL])
    _finalize(module)
    os._exit(status)
