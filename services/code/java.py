"""What Java alone needs: the file a source must be written to and the class to run, both
named by the source itself (``Language.names`` of the ``java`` record)."""

from __future__ import annotations

import bisect
import re

from services.code.sandbox.inside.files import MAX_FILE_NAME_BYTES

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


def java_source_names(source: str) -> tuple[str, str]:
    """(the file a Java source is written to, the class to run): ``java_names``."""
    file_name, main = java_names(source)
    # A name past what a file name may hold keeps the default one: javac then refuses the
    # public class in it (a compile error, where writing the file would fail the build).
    return (f"{file_name}.java" if len(f"{file_name}.class".encode()) <= MAX_FILE_NAME_BYTES else "main.java"), main
