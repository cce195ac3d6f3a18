"""Checking a label's Python code (assert tests, setup) before any sample runs it.

Compiling holds the interpreter lock for as long as the code is long (seconds for a MB), so it
runs in helper processes of the worker's own (``LabelCode``): the worker's other requests go
on meanwhile. What is kept of a verdict is a digest of the code and the verdict, at most
``cache_bytes`` in all, least recently used first out.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import CodeType

from common.limits.budget import hold_work
from common.limits.deadlines import Deadline
from common.limits.errors import Overloaded, PayloadTooLarge, Unprocessable

# Memory compiling takes, per character of code (1.25 MB of asserts peaked at ~210 MB over
# the interpreter's own): held in the request's work budget while it compiles.
COMPILE_BYTES_PER_CHAR = 256
# The address space of a helper process: a label that needs more to compile is a 413.
HELPER_MEMORY_BYTES = 2 << 30
# What one kept verdict costs besides its error text: the digest, the tuple, the dict's slot.
ENTRY_BYTES = 200
OUT_OF_MEMORY = "out of memory"


@dataclass(frozen=True)
class Checked:
    """A piece of label code: why it does not compile ("" when it does), and whether its module
    defines a function ``check`` (HumanEval's form)."""

    error: str
    defines_check: bool


def check_code(code: str) -> Checked:
    """In a helper process: compile ``code`` (from its text: twice as fast as through ``ast``)
    and look for a function ``check`` among what its module defines."""
    try:
        compiled = compile(code, "<label>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return Checked(str(exc) or type(exc).__name__, False)
    except (MemoryError, RecursionError):
        return Checked(OUT_OF_MEMORY, False)
    return Checked("", any(isinstance(c, CodeType) and c.co_name == "check" for c in compiled.co_consts))


def _limit_memory(nbytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


class LabelCode:
    """Label code checked in ``processes`` helper processes, verdicts kept up to ``cache_bytes``."""

    def __init__(self, processes: int, cache_bytes: int) -> None:
        self.processes = processes
        self.cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[bytes, Checked] = OrderedDict()
        self.kept_bytes = 0
        self.compiling = 0  # pieces of code in the helpers now
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.processes, multiprocessing.get_context("forkserver"),
                    initializer=_limit_memory, initargs=(HELPER_MEMORY_BYTES,),
                )  # fmt: skip
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def check(self, codes: Iterable[str], deadline: Deadline) -> dict[str, Checked]:
        """Each distinct piece of ``codes`` checked by ``deadline``: 422 for code that does not
        compile, 413 for code too large to compile, 503 when the helpers are not done in time."""
        wanted = {hashlib.sha256(code.encode(errors="surrogatepass")).digest(): code for code in codes}
        found: dict[str, Checked] = {}
        with self._lock:
            for digest, code in list(wanted.items()):
                if digest in self._kept:
                    self._kept.move_to_end(digest)
                    found[code] = self._kept[digest]
                    del wanted[digest]
        if wanted:
            hold_work(COMPILE_BYTES_PER_CHAR * sum(map(len, wanted.values())), "label code to compile")
            with self._counted(len(wanted)):
                futures = {digest: self._submit(code) for digest, code in wanted.items()}
                for digest, future in futures.items():
                    found[wanted[digest]] = self._keep(digest, self._result(future, deadline))
        for checked in found.values():
            if checked.error == OUT_OF_MEMORY:
                raise PayloadTooLarge("labels: test code too large to compile; split it")
            if checked.error:
                raise Unprocessable(f"labels: test code does not compile: {checked.error[:300]}")
        return found

    @contextlib.contextmanager
    def _counted(self, pieces: int) -> Iterator[None]:
        with self._lock:
            self.compiling += pieces
        try:
            yield
        finally:
            with self._lock:
                self.compiling -= pieces

    def _submit(self, code: str) -> Future[Checked]:
        try:
            return self._executor().submit(check_code, code)
        except BrokenProcessPool:
            self.close()
            return self._executor().submit(check_code, code)

    def _result(self, future: Future[Checked], deadline: Deadline) -> Checked:
        try:
            return future.result(timeout=max(0.0, deadline.remaining()))
        except FutureTimeout:
            future.cancel()
            raise Overloaded("the request's deadline passed while its label code compiled; retry later") from None
        except BrokenProcessPool:
            self.close()  # a helper died (killed): the next request starts new ones
            raise Overloaded("a helper compiling label code died; retry") from None

    def _keep(self, digest: bytes, checked: Checked) -> Checked:
        cost = ENTRY_BYTES + len(checked.error)
        with self._lock:
            if digest not in self._kept and cost <= self.cache_bytes:
                self._kept[digest] = checked
                self.kept_bytes += cost
                while self.kept_bytes > self.cache_bytes:
                    _, gone = self._kept.popitem(last=False)
                    self.kept_bytes -= ENTRY_BYTES + len(gone.error)
        return checked

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._kept), "bytes": self.kept_bytes, "max_bytes": self.cache_bytes,
                "compiling": self.compiling,
            }  # fmt: skip
