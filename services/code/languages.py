"""The languages graded programs may be written in: names and aliases, toolchains, commands.

Python runs in the warm zygote (``inside.program``). Every other language is *built* once
per distinct source (``compile_cache``: keyed by language, flags and the source's hash) by
its toolchain, in the sample's sandbox, and its artifact is then run by each stdin test as a
fresh process (``inside.compiled``). JavaScript's build is a syntax check (``node
--check``) that ships the source itself.

Toolchains are system packages and a pinned Go (``common/setup/install.py``: ``run.sh`` installs
them); each one's version is read from it at startup (``/info``, and the build's cache key);
a missing one is reported in ``/info`` and its samples get ``language_unavailable`` (no verdict).
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.setup.install import GO_BUILD_ENV, GOROOT, SANDBOX_TOOL_DIRS
from services.code.sandbox.inside.compiled import ARTIFACT_DIR, OUTPUT_DIR
from services.code.sandbox.inside.files import MAX_FILE_NAME_BYTES

PYTHON = "python"
# Where a build's source is written, in the sample's /tmp (a language that ships its source
# writes it in the build's output directory).
SOURCE_DIR = "/tmp/src"
# Host directories a toolchain reads besides /usr (shown read-only in the sandbox).
JDK_ETC = "/etc/java-17-openjdk"
# testlib.h (vendored), for custom checkers, shown read-only at TESTLIB.
TESTLIB_DIR = str(Path(__file__).resolve().parents[2] / "third_party" / "testlib")
TESTLIB = "/testlib"
TOOLCHAIN_BINDS = ("--ro-bind-try", JDK_ETC, JDK_ETC, "--ro-bind", TESTLIB_DIR, TESTLIB)
# The interpreter Python checkers run with: the service's own (its prefix is in the sandbox).
PYTHON_INTERPRETER = os.path.realpath(sys.executable)

# The first word of a fenced block's info string (case-insensitive), or a label's or request's
# "language", to a language.
ALIASES = {
    "c": "c",
    "cpp": "cpp", "c++": "cpp", "cc": "cpp", "cxx": "cpp", "cpp20": "cpp", "c++20": "cpp",
    "cpp17": "cpp17", "c++17": "cpp17", "cpp14": "cpp14", "c++14": "cpp14", "cpp11": "cpp11", "c++11": "cpp11",
    "java": "java",
    "go": "go", "golang": "go",
    "rust": "rust", "rs": "rust",
    "javascript": "javascript", "js": "javascript", "node": "javascript", "nodejs": "javascript",
    "python": PYTHON, "py": PYTHON, "python3": PYTHON,
}  # fmt: skip


@dataclass(frozen=True)
class Language:
    """How one language is built and run.

    ``build`` and ``run`` are argument lists where ``{src}`` is the source file, ``{out}`` the
    build's output directory, ``{art}`` where the build products are shown to tests,
    ``{main}`` the class holding ``main`` (Java) and ``{memory_mb}`` the memory limit.
    """

    name: str
    title: str
    extension: str
    tools: tuple[str, ...]  # commands that must exist; the first is the compiler, whose version is shown
    build: tuple[str, ...]
    run: tuple[str, ...]
    # Debian packages that provide ``tools`` (run.sh installs them).
    packages: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    # The build ships the source itself (an interpreted language whose build only checks it).
    ships_source: bool = False

    def key(self, source: str, versions: Mapping[str, str]) -> str:
        """The cache key of ``source`` built by this language's toolchain (its ``versions``)
        and flags: a build by an older compiler is not one of the newer's."""
        digest = hashlib.sha256()
        for part in (self.name, *self.build, *(versions.get(tool, "") for tool in self.tools), "\0", source):
            digest.update(part.encode(errors="surrogatepass") + b"\0")
        return digest.hexdigest()[:40]


C_FLAGS = ("-O2", "-DONLINE_JUDGE", "-pipe", "-w", "-fmax-errors=20")
# ``cpp`` (and ``c++``, ``cc``, ``cxx``) is GNU C++20, what models write; an older standard by name.
CPP_STANDARDS = {"cpp": "gnu++20", "cpp17": "c++17", "cpp14": "c++14", "cpp11": "c++11"}
# The pinned Go (``run.sh`` installs it, the standard library precompiled for these variables).
GO = f"{GOROOT}/bin/go"
GO_ENV = {**GO_BUILD_ENV, "GOROOT": GOROOT, "GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath"}
# The JVM's memory: the heap is the limit (its OutOfMemoryError is memory_limit), the rest small.
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=64m",
             "-XX:MaxMetaspaceSize=256m", "-Xshare:auto")  # fmt: skip

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language("c", "C (gcc, C17)", "c", ("gcc",), ("gcc", "-std=c17", *C_FLAGS, "-o", "{out}/prog", "{src}", "-lm"),
                 ("{art}/prog",), ("gcc",)),
        *(Language(name, f"C++ (g++, {standard.upper()})", "cpp", ("g++",),
                   ("g++", f"-std={standard}", *C_FLAGS, "-o", "{out}/prog", "{src}"), ("{art}/prog",), ("g++",))
          for name, standard in CPP_STANDARDS.items()),
        Language("java", "Java 17 (OpenJDK)", "java", ("javac", "java"),
                 ("javac", "-J-Xmx512m", "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-encoding", "UTF-8",
                  "-proc:none", "-nowarn", "-d", "{out}", "{src}"),
                 ("java", "-Xmx{memory_mb}m", "-Xss64m", *JVM_FLAGS, "-cp", "{art}", "{main}"),
                 ("openjdk-17-jdk-headless",)),
        Language("go", "Go (gc)", "go", (GO,), (GO, "build", "-o", "{out}/prog", "{src}"), ("{art}/prog",),
                 (), env=GO_ENV),
        Language("rust", "Rust (rustc, 2021 edition)", "rs", ("rustc", "gcc"),
                 ("rustc", "--edition", "2021", "-O", "-C", "linker={gcc}", "-C", "strip=debuginfo",
                  "--cfg", "online_judge", "-o", "{out}/prog", "{src}"),
                 ("{art}/prog",), ("rustc-web",)),
        Language("javascript", "JavaScript (Node.js)", "js", ("node",), ("node", "--check", "{src}"),
                 ("node", "--max-old-space-size={memory_mb}", "--stack-size=65500", "{art}/main.js"),
                 ("nodejs",), ships_source=True),
        # Custom checkers (a label's "checker" program), never a graded program's language.
        Language("checker_cpp", "C++ checker (g++, C++17, testlib.h)", "cpp", ("g++",),
                 ("g++", "-std=c++17", "-O2", "-pipe", "-w", f"-I{TESTLIB}", "-o", "{out}/prog", "{src}"),
                 ("{art}/prog",), ("g++",)),
        Language("checker_python", "Python checker", "py", (),
                 ("{python}", "-I", "-S", "-c", "import ast, sys; ast.parse(open(sys.argv[1]).read())", "{src}"),
                 ("{python}", "-I", "-S", "{art}/main.py"), (), ships_source=True),
    )
}  # fmt: skip


@dataclass(frozen=True)
class TimeScale:
    """A language's share of time: each test's limits (CPU and its own wall time) are the
    server's ``test_cpu_s``/``test_wall_s`` times ``factor`` plus ``offset_s``, as contest
    judges give slower runtimes more time (USACO: twice for Java and Python; Baekjoon: a
    factor plus seconds per language; DMOJ: a limit per problem and language)."""

    factor: float = 1.0
    offset_s: float = 0.0

    def of(self, seconds: float) -> float:
        return seconds * self.factor + self.offset_s


_SCALE = re.compile(r"([\w+]+)=([0-9.]+)(?:\+([0-9.]+))?")


def time_scales(spec: str) -> dict[str, TimeScale]:
    """Per language, its ``TimeScale`` from ``spec``: ``LANGUAGE=FACTOR[+SECONDS]`` items
    separated by spaces or commas (``java=1+1 javascript=1+0.25``); a language named by any of
    its aliases; one not named keeps its limits. Raises ``ValueError`` for anything else."""
    scales: dict[str, TimeScale] = {}
    for item in re.split(r"[\s,]+", spec.strip()):
        if not item:
            continue
        found = _SCALE.fullmatch(item)
        name = language_of(found.group(1)) if found else None
        if found is None or name is None:
            raise ValueError(f"{item!r}: expected LANGUAGE=FACTOR[+SECONDS] with a known language")
        try:
            scale = TimeScale(float(found.group(2)), float(found.group(3) or 0))
        except ValueError:
            raise ValueError(f"{item!r}: the factor and the seconds are numbers") from None
        if not 0 < scale.factor <= 100 or scale.offset_s > 600:
            raise ValueError(f"{item!r}: the factor is in (0, 100], the seconds at most 600")
        scales[name] = scale
    return scales


# What a program that failed to allocate prints as it dies: Python's and Java's error, C++'s
# exception, Go's and Rust's runtimes, a V8 heap at its limit. Without cgroups the address
# space limit makes an allocation fail; with them, the kernel's OOM kill says it.
OUT_OF_MEMORY = ("MemoryError", "std::bad_alloc", "out of memory", "memory allocation of ")


def run_failure(
    timed_out: bool, over_memory: bool, exit: int, stderr: str, output_exceeded: bool = False
) -> str | None:
    """The status of a program's run that did not end well, in the judge's order (its time, its
    output, its memory: the sandbox's limit or the runtime's own report, then its exit); None
    for a run that exited 0 within its limits."""
    if timed_out:
        return "timeout"
    if output_exceeded:
        return "output_limit"
    if over_memory:
        return "memory_limit"
    if exit != 0:
        return "memory_limit" if any(sign in stderr for sign in OUT_OF_MEMORY) else "runtime_error"
    return None


# A custom checker's language to the entry it is built with.
CHECKER_LANGUAGES = {**dict.fromkeys(CPP_STANDARDS, "checker_cpp"), PYTHON: "checker_python"}


def language_of(name: object) -> str | None:
    """The language a tag or a ``"language"`` field names (its first word, any case), or None."""
    if not isinstance(name, str) or not name.strip():
        return None
    return ALIASES.get(name.split()[0].lower())


def tool_paths() -> dict[str, str]:
    """Each toolchain command's real path on this host (absent ones left out), looked for
    where ``run.sh`` counts it installed (the pinned Go by its absolute path): commands run by
    their real path, so no ``/etc/alternatives`` link is needed in the sandbox."""
    found: dict[str, str] = {}
    for tool in {t for lang in LANGUAGES.values() for t in lang.tools}:
        path = shutil.which(tool, path=SANDBOX_TOOL_DIRS)
        if path is not None:
            found[tool] = os.path.realpath(path)
    return found


# How each compiler says its version (``--version`` otherwise).
VERSION_ARGS = {GO: ("version",), "javac": ("-version",)}


def tool_versions(tools: Mapping[str, str]) -> dict[str, str]:
    """The first line each compiler (a language's first tool) of ``tools`` prints for its
    version, asked once: what ``/info`` shows and what the cache keys hold."""
    versions: dict[str, str] = {}
    for tool in {lang.tools[0] for lang in LANGUAGES.values() if lang.tools} & set(tools):
        try:
            said = subprocess.run(
                [tools[tool], *VERSION_ARGS.get(tool, ("--version",))], capture_output=True, text=True, timeout=60,
                env={"PATH": SANDBOX_TOOL_DIRS, **(GO_ENV if tool == GO else {})},
            )  # fmt: skip
            versions[tool] = (said.stdout + said.stderr).strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            versions[tool] = "unknown"
    return versions


def describe(tools: Mapping[str, str], versions: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """Per language programs may be written in: its compiler's path and version, and how its
    programs are built and run (``/info``'s ``model.toolchains``)."""
    shown: dict[str, dict[str, object]] = {
        PYTHON: {"compiler": PYTHON_INTERPRETER, "version": sys.version.split()[0], "aliases": _aliases(PYTHON)}
    }
    for name, lang in LANGUAGES.items():
        if name in CHECKER_LANGUAGES.values():
            continue
        compiler = lang.tools[0]
        shown[name] = {
            "title": lang.title, "compiler": tools.get(compiler), "version": versions.get(compiler),
            "build": " ".join(lang.build), "run": " ".join(lang.run), "env": dict(lang.env),
            "aliases": _aliases(name),
        }  # fmt: skip
    return shown


def _aliases(name: str) -> list[str]:
    return [alias for alias, language in ALIASES.items() if language == name]


def missing_tools(language: Language, tools: dict[str, str]) -> list[str]:
    return [tool for tool in language.tools if tool not in tools]


# A Java source's type declarations, its main method and its package. A declaration starts the
# source or follows a ``;``, ``{`` or ``}`` (comments and annotations blanked), its modifiers on
# any lines: each scan starts at one of those characters and ends at the first other word, so
# no scan overlaps another.
_JAVA_TYPE = re.compile(
    r"(?:\A|[;{}])\s*((?:(?:public|protected|private|final|abstract|strictfp|static|sealed|non-sealed)\s+)*)"
    r"(?:class|interface|enum|record)\s+([\w$]+)"
)
# An annotation (``@SuppressWarnings(...)``, ``@java.lang.Deprecated``), never ``@interface``;
# its arguments nest parentheses once at most (strings are blanked before).
_JAVA_ANNOTATION = re.compile(r"@(?!interface\b)\s*[\w$.]+(?:\s*\((?:[^()]|\([^()]*\))*\))?")
_JAVA_MAIN = re.compile(r"\bstatic\s+(?:(?:public|final|synchronized|strictfp)\s+)*void\s+main\s*\(")
_JAVA_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)\s*;", re.M)
# Comments and string, text block and char literals: blanked before braces are counted. Each
# alternative matches wherever it starts (an unclosed one runs to the end of its line or of
# the source), so the scan is linear: a failed match would be retried at every later opener.
_JAVA_NOT_CODE = re.compile(
    r'"""(?:\\.|[^\\])*?(?:"""|\Z)|//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:\\.|[^"\\\n])*"?|\'(?:\\.|[^\'\\\n])*\'?', re.S
)


def java_names(source: str) -> tuple[str, str]:
    """(file name without ``.java``, class to run) of a Java source.

    javac wants a public top-level class in a file of its name; the class to run is the
    innermost type whose body holds ``static void main`` (``Outer$Inner`` when nested),
    qualified by the package. Linear in the source's length (it is a sample's to choose).
    """
    text = _JAVA_NOT_CODE.sub(lambda m: " " * len(m.group()), source)
    text = _JAVA_ANNOTATION.sub(lambda m: " " * len(m.group()), text)
    opens: list[int] = []
    closes: list[int] = []
    closing: dict[int, int] = {}  # an opening brace's closing one
    open_now: list[int] = []
    for brace in re.finditer(r"[{}]", text):
        if brace.group() == "{":
            opens.append(brace.start())
            open_now.append(brace.start())
        else:
            closes.append(brace.start())
            if open_now:
                closing[open_now.pop()] = brace.start()

    def body(after: int) -> tuple[int, int]:
        """The braces of the type declared before ``after`` (to the end when unclosed)."""
        first = bisect.bisect_left(opens, after)
        return (opens[first], closing.get(opens[first], len(text))) if first < len(opens) else (after, after)

    def top_level(at: int) -> bool:
        return bisect.bisect_left(opens, at) == bisect.bisect_left(closes, at)

    types = [(m.group(2), m.group(1).split(), top_level(m.start(1)), body(m.end())) for m in _JAVA_TYPE.finditer(text)]
    public = next((name for name, modifiers, top, _ in types if top and "public" in modifiers), None)
    main_at = _JAVA_MAIN.search(text)
    # Every type whose body holds main, outermost first (types are in source order).
    holder = "$".join(
        name for name, _, _, (start, end) in types if main_at is not None and start < main_at.start() <= end
    )
    holder = holder or public or next((name for name, _, top, _ in types if top), "Main")
    package = _JAVA_PACKAGE.search(text)
    return public or holder, (f"{package.group(1)}." if package else "") + holder


@dataclass(frozen=True)
class Program:
    """One source in one language: what its build and its runs execute."""

    language: Language
    source: str
    key: str
    source_name: str
    source_path: str  # where its build reads it, in the sample's /tmp
    build: list[str]
    run: list[str]
    env: dict[str, str]


def _unpadded(source: str) -> str:
    """``source`` without the NULs among its trailing blanks (a file padded after its end),
    which javac refuses and gcc ignores."""
    body = source.rstrip("\0 \t\r\n\f\v")
    return body + "\n" if "\0" in source[len(body) :] else source


def program(
    language: Language, source: str, tools: Mapping[str, str], versions: Mapping[str, str], memory_mb: int
) -> Program:
    """The build and run commands of ``source`` (tools by their real paths; ``versions``: the
    compilers', ``tool_versions``)."""
    source = _unpadded(source)
    source_name = f"main.{language.extension}"
    main = ""
    if language.name == "java":
        file_name, main = java_names(source)
        # A name past what a file name may hold keeps the default one: javac then refuses the
        # public class in it (a compile error, where writing the file would fail the build).
        if len(f"{file_name}.class".encode()) <= MAX_FILE_NAME_BYTES:
            source_name = f"{file_name}.java"
    source_path = f"{OUTPUT_DIR if language.ships_source else SOURCE_DIR}/{source_name}"
    fill = {"src": source_path, "out": OUTPUT_DIR, "art": ARTIFACT_DIR, "main": main,
            "memory_mb": str(memory_mb), "gcc": tools.get("gcc", "gcc"), "python": PYTHON_INTERPRETER}  # fmt: skip

    def command(template: tuple[str, ...]) -> list[str]:
        argv = [part.format(**fill) for part in template]
        argv[0] = tools.get(argv[0], argv[0])
        return argv

    build = command(language.build)
    key = language.key(source + "\0" + source_name, versions)
    return Program(language, source, key, source_name, source_path, build, command(language.run), dict(language.env))
