"""The languages graded programs may be written in: one ``Language`` record each in
``LANGUAGES`` (names and aliases, toolchain packages, commands, defaults), which the aliases,
``run.sh``'s installer (``TOOLCHAINS``), the compile cache, the settings and SandboxFusion's
language names all read; docs/adding-a-language.md says how to add one.

Python runs in the warm zygote (``inside.program``). Every other language is *built* once
per distinct source (``sandbox.compile_cache``: keyed by language, flags and the source's hash) by
its toolchain, in the sample's sandbox, and its artifact is then run by each stdin test as a
fresh process (``inside.compiled_programs``). JavaScript's build is a syntax check (``node
--check``) that ships the source itself.

Toolchains are system packages (each record's ``packages``) and a pinned Go
(``common/setup/install.py``: ``run.sh`` installs them); each one's version is read from it at
startup (``/info``, and the build's cache key); a missing one is reported in ``/info`` and
its samples get ``language_unavailable`` (no verdict).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.setup.install import GO_BUILD_ENV, GOROOT, SANDBOX_TOOL_DIRS, SystemPackage
from services.code.java import java_source_names
from services.code.sandbox.inside.compiled_programs import ARTIFACT_DIR, OUTPUT_DIR

PYTHON = "python"
# Python's names (it runs in the warm zygote, no ``Language`` of its own), and SandboxFusion's.
PYTHON_ALIASES = (PYTHON, "py", "python3")
PYTHON_SANDBOX_FUSION = "python"
# Where a build's source is written, in the sample's /tmp (a language that ships its source
# writes it in the build's output directory).
SOURCE_DIR = "/tmp/src"
# testlib.h (vendored), for custom checkers, shown read-only at TESTLIB.
TESTLIB_DIR = str(Path(__file__).resolve().parents[2] / "third_party" / "testlib")
TESTLIB = "/testlib"
# The interpreter Python checkers run with: the service's own (its prefix is in the sandbox).
PYTHON_INTERPRETER = os.path.realpath(sys.executable)


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

    def __str__(self) -> str:
        """As ``time_scales`` reads it after ``LANGUAGE=``."""
        return f"{self.factor:g}" + (f"+{self.offset_s:g}" if self.offset_s else "")


@dataclass(frozen=True)
class Language:
    """Everything the service knows of one language: its record in ``LANGUAGES`` is read by
    the aliases, the installer (``TOOLCHAINS``), the compile cache, the settings' defaults and
    SandboxFusion's language names.

    ``build`` and ``run`` are argument lists where ``{src}`` is the source file, ``{out}`` the
    build's output directory, ``{art}`` where the build products are shown to tests,
    ``{main}`` the class holding ``main`` (Java), ``{memory_mb}`` the memory limit, ``{gcc}``
    gcc's real path and ``{python}`` the service's interpreter.
    """

    name: str
    title: str
    extension: str
    # Commands that must exist; the first is the compiler, whose version is shown.
    tools: tuple[str, ...]
    build: tuple[str, ...]
    run: tuple[str, ...]
    # The first words of a fenced block's info string (any case), or a label's or request's
    # "language", that name it; none: only a checker's entry (``CHECKER_LANGUAGES``).
    aliases: tuple[str, ...] = ()
    # Distribution packages that provide ``tools`` (run.sh installs them; a toolchain it
    # installs otherwise, the pinned Go, is ``common/setup/install.py``'s).
    packages: tuple[SystemPackage, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # Host directories its toolchain reads besides /usr, shown read-only in the sandbox where
    # they exist.
    host_dirs: tuple[str, ...] = ()
    # The build ships the source itself (an interpreted language whose build only checks it).
    ships_source: bool = False
    # How the compiler says its version.
    version_args: tuple[str, ...] = ("--version",)
    # (its file's name, ``{main}``) of a source whose file and entry it names itself (Java);
    # None: ``main.<extension>``.
    names: Callable[[str], tuple[str, str]] | None = None
    # ``SCORER_CODE_TIME_SCALES``'s default for it: what its runtime spends before and around
    # the program (bench/code/startup.py measures it).
    time_scale: TimeScale = TimeScale()
    # Without cgroups, address space allowed beyond the memory limit: a runtime that reserves
    # much more than it uses (its heap held to the limit by its own flags).
    address_space_extra: int = 0
    # SandboxFusion's name for it (``/run_code``'s ``language``); "": not one it runs.
    sandbox_fusion: str = ""

    def key(self, source: str, versions: Mapping[str, str]) -> str:
        """The cache key of ``source`` built by this language's toolchain (its ``versions``)
        and flags: a build by an older compiler is not one of the newer's."""
        digest = hashlib.sha256()
        for part in (self.name, *self.build, *(versions.get(tool, "") for tool in self.tools), "\0", source):
            digest.update(part.encode(errors="surrogatepass") + b"\0")
        return digest.hexdigest()[:40]


C_FLAGS = ("-O2", "-DONLINE_JUDGE", "-pipe", "-w", "-fmax-errors=20")
# ``cpp`` (and ``c++``, ``cc``, ``cxx``) is GNU C++20, what models write; an older standard by
# name; each standard's aliases.
CPP_STANDARDS = {
    "cpp": ("gnu++20", ("cpp", "c++", "cc", "cxx", "cpp20", "c++20")),
    "cpp17": ("c++17", ("cpp17", "c++17")),
    "cpp14": ("c++14", ("cpp14", "c++14")),
    "cpp11": ("c++11", ("cpp11", "c++11")),
}
# The packages more than one language needs.
GCC = SystemPackage("gcc", "gcc")
GXX = SystemPackage("g++", "g++", other_names={"dnf": "gcc-c++"})
# The pinned Go (``run.sh`` installs it, the standard library precompiled for these variables).
GO = f"{GOROOT}/bin/go"
GO_ENV = {**GO_BUILD_ENV, "GOROOT": GOROOT, "GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath"}
# The JVM's memory: the heap is the limit (its OutOfMemoryError is memory_limit), the rest small.
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=64m",
             "-XX:MaxMetaspaceSize=256m", "-Xshare:auto")  # fmt: skip

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language(
            "c", "C (gcc, C17)", "c", ("gcc",), ("gcc", "-std=c17", *C_FLAGS, "-o", "{out}/prog", "{src}", "-lm"),
            ("{art}/prog",), aliases=("c",), packages=(GCC,),
        ),
        *(
            Language(
                name, f"C++ (g++, {standard.upper()})", "cpp", ("g++",),
                ("g++", f"-std={standard}", *C_FLAGS, "-o", "{out}/prog", "{src}"), ("{art}/prog",),
                aliases=aliases, packages=(GXX,), sandbox_fusion="cpp" if name == "cpp" else "",
            )
            for name, (standard, aliases) in CPP_STANDARDS.items()
        ),
        Language(
            "java", "Java 17 (OpenJDK)", "java", ("javac", "java"),
            ("javac", "-J-Xmx512m", "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-encoding", "UTF-8",
             "-proc:none", "-nowarn", "-d", "{out}", "{src}"),
            ("java", "-Xmx{memory_mb}m", "-Xss64m", *JVM_FLAGS, "-cp", "{art}", "{main}"),
            aliases=("java",),
            packages=(SystemPackage("openjdk-17-jdk-headless", "javac",
                                    other_names={"dnf": "java-17-openjdk-devel", "apk": "openjdk17-jdk"}),),
            host_dirs=("/etc/java-17-openjdk",), version_args=("-version",), names=java_source_names,
            time_scale=TimeScale(2, 0.5), address_space_extra=2048 << 20, sandbox_fusion="java",
        ),
        Language(
            "go", "Go (gc)", "go", (GO,), (GO, "build", "-o", "{out}/prog", "{src}"), ("{art}/prog",),
            aliases=("go", "golang"), env=GO_ENV, version_args=("version",), address_space_extra=1024 << 20,
            sandbox_fusion="go",
        ),
        Language(
            "rust", "Rust (rustc, 2021 edition)", "rs", ("rustc", "gcc"),
            ("rustc", "--edition", "2021", "-O", "-C", "linker={gcc}", "-C", "strip=debuginfo",
             "--cfg", "online_judge", "-o", "{out}/prog", "{src}"),
            ("{art}/prog",), aliases=("rust", "rs"),
            # Debian 12's ``rustc-web`` is a current rustc that replaces its ``rustc`` (1.63).
            packages=(SystemPackage("rustc-web", "rustc", "1.65", {"dnf": "rust", "apk": "rust"}), GCC),
            sandbox_fusion="rust",
        ),
        Language(
            "javascript", "JavaScript (Node.js)", "js", ("node",), ("node", "--check", "{src}"),
            ("node", "--max-old-space-size={memory_mb}", "--stack-size=65500", "{art}/main.js"),
            aliases=("javascript", "js", "node", "nodejs"), packages=(SystemPackage("nodejs", "node"),),
            ships_source=True, time_scale=TimeScale(2, 0.5), address_space_extra=4096 << 20,
            sandbox_fusion="nodejs",
        ),
        # Custom checkers (a label's "checker" program), never a graded program's language.
        Language(
            "checker_cpp", "C++ checker (g++, C++17, testlib.h)", "cpp", ("g++",),
            ("g++", "-std=c++17", "-O2", "-pipe", "-w", f"-I{TESTLIB}", "-o", "{out}/prog", "{src}"),
            ("{art}/prog",), packages=(GXX,),
        ),
        Language(
            "checker_python", "Python checker", "py", (),
            ("{python}", "-I", "-S", "-c", "import ast, sys; ast.parse(open(sys.argv[1]).read())", "{src}"),
            ("{python}", "-I", "-S", "{art}/main.py"), ships_source=True,
        ),
    )
}  # fmt: skip

# A name (the first word of a fenced block's info string, any case, or a label's or request's
# "language") to the language it names.
ALIASES = {
    **dict.fromkeys(PYTHON_ALIASES, PYTHON),
    **{alias: lang.name for lang in LANGUAGES.values() for alias in lang.aliases},
}
# The distribution packages of every language's toolchain (``Service.toolchains``: run.sh installs them).
TOOLCHAINS = tuple({package.name: package for lang in LANGUAGES.values() for package in lang.packages}.values())
# SandboxFusion's language names this node runs, to ours.
SANDBOX_FUSION_NAMES = {
    PYTHON_SANDBOX_FUSION: PYTHON,
    **{lang.sandbox_fusion: lang.name for lang in LANGUAGES.values() if lang.sandbox_fusion},
}
# What the sandbox shows of the host for the toolchains: each language's ``host_dirs``, testlib.
HOST_DIRS = tuple(dict.fromkeys(d for lang in LANGUAGES.values() for d in lang.host_dirs))
TOOLCHAIN_BINDS = (*(arg for d in HOST_DIRS for arg in ("--ro-bind-try", d, d)), "--ro-bind", TESTLIB_DIR, TESTLIB)
# ``SCORER_CODE_TIME_SCALES``'s default: each language's own ``time_scale``.
DEFAULT_TIME_SCALES = " ".join(
    f"{lang.name}={lang.time_scale}" for lang in LANGUAGES.values() if lang.time_scale != TimeScale()
)


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


def tool_versions(tools: Mapping[str, str]) -> dict[str, str]:
    """The first line each compiler (a language's first tool) of ``tools`` prints for its
    version, asked once: what ``/info`` shows and what the cache keys hold."""
    versions: dict[str, str] = {}
    compilers: dict[str, Language] = {}
    for lang in LANGUAGES.values():
        if lang.tools and lang.tools[0] in tools:
            compilers.setdefault(lang.tools[0], lang)
    for tool, lang in compilers.items():
        try:
            said = subprocess.run(
                [tools[tool], *lang.version_args], capture_output=True, text=True, timeout=60,
                env={"PATH": SANDBOX_TOOL_DIRS, **lang.env},
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
    source_name, main = language.names(source) if language.names else (f"main.{language.extension}", "")
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
