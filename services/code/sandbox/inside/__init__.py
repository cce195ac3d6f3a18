"""What runs inside the code sandbox, one module per process role (stdlib only, no other imports).

- ``messages``: the messages between the server and a sample's supervisor (typed, framed JSON),
  the plain-data codec of calls and answers, and the fd numbers of the pipes between processes;
- ``confine``: what confines a program's processes (namespaces, seccomp, rlimits, uids) and
  clears up after them;
- ``program``: the bodies of the processes that run the program, untrusted: a stdin test's,
  the candidate's call server;
- ``tester``: the body of the assert tests' process, which runs the label's code under a uid
  of its own;
- ``socket_child``: a child the supervisor forks to serve it over a socket pair (the keeper of
  an interactive sample's answers, the assert tests' candidate source);
- ``compiled_programs``: a compiled language's build (its compiler, then the compile cache) and runs;
- ``files``: a ``/run_code`` run's files, placed before it and fetched after it;
- ``interactive_test``: an interactive test's program and interactor, run at once and joined by pipes;
- ``relay``: the relay of a candidate's calls, trusted: it times each test on the candidate's
  CPU clock (run by the supervisor for assert tests, and imported by the server, ``host``,
  for the call-based tests it relays);
- ``supervisor``: one sample, trusted (root): runs its tests, times them, streams their outcomes;
- ``zygote``: the warm fork server that forks a supervisor per connection.

``host.Sandbox`` ships this package's sources into the sandbox as one unit (``bundle``),
since the sandbox's root holds no checkout.
"""

from __future__ import annotations

from pathlib import Path

MODULES = (
    "messages",
    "confine",
    "socket_child",
    "program",
    "tester",
    "compiled_programs",
    "files",
    "relay",
    "interactive_test",
    "supervisor",
    "zygote",
)


# What ``python -I -S -c`` runs in the sandbox: the bundle, read from its stdin (then
# ``/dev/null`` there, as before). On the command line the bundle cost the zygote 1.6 MiB more
# resident memory (the interpreter keeps wide-character copies of its command line), whose
# page table entries every sample's forks copy.
LOADER = (
    "import os, sys; source = sys.stdin.buffer.read().decode(); null = os.open(os.devnull, os.O_RDONLY); "
    "os.dup2(null, 0); os.close(null); exec(source)"
)


def bundle() -> str:
    """Python source that loads this package from sources held in itself, then runs the zygote:
    what ``LOADER`` runs in the sandbox."""
    here = Path(__file__).parent
    sources = {f"{__name__}.{name}": (here / f"{name}.py").read_text() for name in MODULES}
    parts = __name__.split(".")
    packages = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return BOOT.format(sources=repr(sources), packages=repr(packages), main=f"{__name__}.zygote")


# Registers each shipped module's source with the import system (empty parent packages), so the
# modules import each other as they do in the checkout. A finder and loader by duck typing:
# ``importlib.abc`` and ``importlib.util`` would pull ``importlib.resources``, ``pathlib``,
# ``tempfile``, ``zipimport``, compressors... into the zygote, whose every resident page each
# sample's fork copies (page tables) and may copy again (copy-on-write).
BOOT = """
import importlib, importlib.machinery, sys
SOURCES = {sources}
PACKAGES = {packages}
class _Shipped:
    def find_spec(self, name, path=None, target=None):
        if name in SOURCES or name in PACKAGES:
            return importlib.machinery.ModuleSpec(name, self, is_package=name in PACKAGES)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        source = SOURCES.get(module.__name__, "")
        exec(compile(source, "<sandboxed " + module.__name__ + ">", "exec"), module.__dict__)
sys.meta_path.insert(0, _Shipped())
importlib.import_module({main!r}).main()
"""
