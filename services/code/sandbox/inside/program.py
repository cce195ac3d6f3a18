"""The bodies of the processes that run the program, untrusted (the tests' process, which runs
the label's code, is ``tester``'s).

- ``run_stdin_program``: a stdin test's process runs the program on its stdin;
- ``serve_calls``: the candidate's process loads the program and answers calls as plain data.

Each is entered in a process ``confine.spawn`` made (its uid, limits and fds already set),
and first made to look like a fresh ``python3`` (``_fresh_interpreter``): a program runs as
a judge's CPython would run it, the stdin one as ``__main__`` ending as the interpreter ends,
the others as a module of their own (``PROGRAM_MODULE``), as HumanEval's and LiveCodeBench's
harnesses load them.
"""

from __future__ import annotations

import _ast
import _sitebuiltins
import atexit
import builtins
import contextlib
import gc
import io
import json
import os
import sys
import types
import typing

from services.code.sandbox.inside.messages import (
    ANSWERS_FD,
    CALLS_FD,
    LOADED,
    RESULT_FD,
    STDERR_TAIL,
    from_plain,
    to_plain,
)  # fmt: skip


def _line(out: typing.TextIO, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


# Call-based and assert programs are loaded as this module, registered in ``sys.modules``
# (pickle finds their functions); a stdin program is ``__main__``.
PROGRAM_MODULE = "solution"
# What CPython skips at the start of a source file it runs (UTF-8's byte-order mark).
BYTE_ORDER_MARK = "\ufeff"
# Each program runs its numeric libraries on one thread: its CPU limit is per process.
THREAD_VARIABLES = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# What ``_fresh_interpreter`` makes anew in each process, which a prelude may bind: (module, attribute).
FRESH_ATTRIBUTES = (
    ("sys", "stdin"), ("sys", "__stdin__"), ("sys", "stdout"), ("sys", "__stdout__"), ("sys", "stderr"),
    ("sys", "__stderr__"), ("sys", "argv"), ("builtins", "exit"), ("builtins", "quit"), ("builtins", "help"),
)  # fmt: skip


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
        return compile(code.removeprefix(BYTE_ORDER_MARK), "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        _line(out, report(f"{type(exc).__name__}: {exc}"))
        os._exit(0)


class PreparedPrelude(typing.NamedTuple):
    """A program module with a prelude's leading imports run in it (``prepare_preludes``)."""

    module: types.ModuleType
    given: dict  # what the imports bound (the module's namespace then)
    fresh: list[tuple[str, str, str]]  # the names bound to what ``_fresh_interpreter`` makes: (name, module, attribute)
    rest: types.CodeType | None  # the prelude's statements after those imports, run by each process


# Prepared preludes by their text: made once in the zygote, so every candidate forked from it finds its own copy.
_PREPARED: dict[str, PreparedPrelude] = {}


def prepare_preludes(preludes: typing.Iterable[str]) -> None:
    """Run each prelude's leading imports of modules this process has imported (the zygote's
    warm ones) in a program module of its own, once: a candidate then starts from a copy of
    that module instead of running them. Binding a prelude's few hundred names writes each
    object's reference count, on pages the candidate shares with the zygote: ``lcb`` cost each
    call-based sample about 500 page faults and 1.5 ms of CPU. What the process makes anew
    (``FRESH_ATTRIBUTES``) is a stand-in meanwhile, each name bound to one rebound in the
    candidate; the statements after the imports (``lcb``'s ``sys.setrecursionlimit``) run
    there too. A prelude that fails here is run whole in the candidate, as any other."""
    for prelude in preludes:
        with contextlib.suppress(Exception):
            _PREPARED[prelude] = _prepare(prelude)


def _prepare(prelude: str) -> PreparedPrelude:
    body = compile(prelude, "<prelude>", "exec", _ast.PyCF_ONLY_AST).body
    warm = next((at for at, node in enumerate(body) if not _warm_import(node)), len(body))
    if not warm:
        raise ValueError("no leading import of a module imported here")
    lines = prelude.splitlines(keepends=True)
    end = body[warm - 1].end_lineno
    module = types.ModuleType(PROGRAM_MODULE)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    stand_ins = {where: object() for where in FRESH_ATTRIBUTES}
    missing = object()
    saved = {where: getattr(sys.modules[where[0]], where[1], missing) for where in FRESH_ATTRIBUTES}
    try:
        for (name, attribute), stand_in in stand_ins.items():
            setattr(sys.modules[name], attribute, stand_in)
        exec(compile("".join(lines[:end]), "<prelude>", "exec"), module.__dict__)
    finally:
        for (name, attribute), value in saved.items():
            if value is missing:
                delattr(sys.modules[name], attribute)
            else:
                setattr(sys.modules[name], attribute, value)
    where_of = {id(stand_in): where for where, stand_in in stand_ins.items()}
    given = dict(module.__dict__)
    fresh = [(name, *where_of[id(value)]) for name, value in given.items() if id(value) in where_of]
    rest = compile("\n" * end + "".join(lines[end:]), "<prelude>", "exec") if warm < len(body) else None
    return PreparedPrelude(module, given, fresh, rest)


def _warm_import(node: object) -> bool:
    """Whether ``node`` (a statement) imports only modules, and names of modules, already imported."""
    if isinstance(node, _ast.Import):
        return all(alias.name in sys.modules for alias in node.names)
    if isinstance(node, _ast.ImportFrom):
        module = sys.modules.get(node.module or "") if node.level == 0 else None
        return module is not None and all(alias.name == "*" or hasattr(module, alias.name) for alias in node.names)
    return False


def _start_program_module(prelude: str) -> tuple[dict, dict]:
    """The candidate's program module (``PROGRAM_MODULE``, registered) with ``prelude`` run in
    it: its namespace and what the prelude bound (``given``), prepared in the zygote where it
    could be (``prepare_preludes``)."""
    prepared = _PREPARED.get(prelude)
    if prepared is None:
        namespace = _program_module(PROGRAM_MODULE).__dict__
        return namespace, _run_prelude(prelude, namespace)
    sys.modules[PROGRAM_MODULE] = prepared.module
    namespace, given = prepared.module.__dict__, prepared.given
    for name, module, attribute in prepared.fresh:
        namespace[name] = given[name] = getattr(sys.modules[module], attribute)
    if prepared.rest is not None:
        exec(prepared.rest, namespace)
        for name in _names(prepared.rest):
            if name in namespace:
                given[name] = namespace[name]
            else:
                given.pop(name, None)
    return namespace, given


def _names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it may bind (and read)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


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
    try:
        namespace, given = _start_program_module(prelude)
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
