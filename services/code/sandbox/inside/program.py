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
