"""The body of the tests' process (``run_tests``): an assert label's code, trusted, calling the
candidate's functions through proxies (``Candidate``) and reporting a verdict per test.

It runs as a uid of its own, apart from the candidate's process, and is entered in a process
``confine.spawn`` made. What it observes of the program never depends on whether an earlier
answer was right (``_observed``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import json
import os
import re
import sys
import typing

from services.code.sandbox.inside.messages import (
    STDERR_TAIL,
    TESTER_IN_FD,
    TESTER_OUT_FD,
    TrustedTests,
    from_plain,
    to_plain,
)

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
