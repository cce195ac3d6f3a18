"""The warm fork server that runs inside the sandbox's namespaces (stdlib only).

Started once per worker (by ``sandbox.Sandbox``) as ``python -I -S -c <the package's bundle>
<fd> <packages>``, where ``fd`` is a listening Unix socket made by the server and
``packages`` the directory of the packages programs may import ("" for none). Forking a warm interpreter
costs a few milliseconds where a fresh ``python3`` costs over 100 ms (docs/ARCHITECTURE.md §8).
Per connection it forks a supervisor (``supervisor.supervise``) for one sample.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys

from services.code.sandboxed.supervisor import supervise

# Imported once in the zygote so each forked solution finds them warm.
WARM_MODULES = ("bisect", "collections", "functools", "heapq", "itertools", "math", "random", "re", "string")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[2]:
        sys.path.append(sys.argv[2])  # after the standard library, which it cannot shadow
    sys.set_int_max_str_digits(0)  # the server's jobs hold the integers its labels may (scorer.INT_MAX_DIGITS)
    for name in WARM_MODULES:
        __import__(name)
    gc.freeze()  # forked children then copy fewer pages when their collector runs
    listener = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    print("zygote ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                supervise(conn)
            except BaseException:  # the server sees the closed connection
                code = 1
            finally:
                os._exit(code)
        conn.close()
