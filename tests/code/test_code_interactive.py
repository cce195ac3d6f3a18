"""Interactive problems (issue 31): a testlib interactor and the program run at once, joined
by pipes, each confined; every program of a "guess the number" problem written for these
tests gets the verdict a judge gives, and neither side can cheat or stall the node."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
import requests

from services.code.judging.interactor import verdict
from services.code.sandbox.inside.messages import InteractOutcome
from testing.code import LANGUAGES_ENV
from testing.interactive import CPP_SEARCH, GUESS, JAVA_SEARCH, LABEL, PY_SEARCH
from testing.server import Server, gunicorn_server
from testing.timing import within


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", LANGUAGES_ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


PROGRAMS = [
    ("cpp accepted", "cpp", CPP_SEARCH.replace("OFFSET", "0"), "passed"),
    ("cpp wrong", "cpp", CPP_SEARCH.replace("OFFSET", "1"), "wrong_answer"),
    ("cpp linear search", "cpp", '#include <cstdio>\nint main(){char r[4];for(long x=2;;x++){printf("? %ld\\n",x);'
     'fflush(stdout);if(scanf("%3s",r)!=1)return 0;if(r[0]==\'=\'){printf("! %ld\\n",x);fflush(stdout);return 0;}}}',
     "wrong_answer"),
    ("cpp loops", "cpp", "int main(){volatile unsigned long x=0;for(;;)x++;}", "timeout"),
    ("cpp crashes", "cpp", '#include <cstdio>\nint main(){printf("? 5\\n");fflush(stdout);char r[4];'
     'scanf("%3s",r);volatile int*p=0;*p=1;}', "runtime_error"),
    ("cpp allocates", "cpp", "#include <cstring>\n#include <cstdlib>\nint main(){char*volatile p=(char*)"
     "malloc(1ul<<30);memset(p,1,1ul<<30);return p[7];}", "memory_limit"),
    ("cpp garbage", "cpp", '#include <cstdio>\nint main(){printf("hello there\\n");fflush(stdout);'
     'char r[4];scanf("%3s",r);}', "wrong_answer"),
    ("cpp exits at once", "cpp", "int main(){return 0;}", "wrong_answer"),
    ("python accepted", "python", PY_SEARCH.replace("FLUSH", "True"), "passed"),
    ("python waits unflushed", "python", "import sys\nprint('? 5')\nsys.stdin.readline()", "timeout"),
    ("python raises", "python", "print('? 5', flush=True)\ninput()\nraise ValueError('no')", "runtime_error"),
    ("java accepted", "java", JAVA_SEARCH.replace("CRASH", ""), "passed"),
    ("java crashes", "java", JAVA_SEARCH.replace("CRASH", "if (lo > 0) throw new RuntimeException();"),
     "runtime_error"),
]  # fmt: skip


def grade(url: str, programs: list[tuple[str, str]], label: dict) -> dict:
    """One request: each (fence tag, source) a sample graded on ``label``."""
    fenced = [f"My solution.\n```{tag}\n{code}\n```\n" for tag, code in programs]
    body = {"outputs": fenced, "prompts": ["p"] * len(fenced), "labels": [label] * len(fenced)}
    response = requests.post(url + "/reward/score", json=body, timeout=600)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def test_each_program_gets_the_verdict_a_judge_gives(server: Server) -> None:
    answered = grade(server.url, [(tag, code) for _, tag, code, _ in PROGRAMS], LABEL)
    got = {name: (answered["error_types"][i], answered["rewards"][i]) for i, (name, *_) in enumerate(PROGRAMS)}
    want = {
        name: (None if status == "passed" else status, float(status == "passed")) for name, _, _, status in PROGRAMS
    }
    assert got == want


def test_the_interactors_points_are_the_tests_score(server: Server) -> None:
    """testlib's ``quitp``: a guess within 10 of the number earns half of the test."""
    half = GUESS.replace('quitf(_wa, "guessed %lld', 'if (llabs(x - secret) <= 10) quitp(0.5, "near");\n'
                         '            quitf(_wa, "guessed %lld')  # fmt: skip
    label = {"interactor": half, "tests": LABEL["tests"][:1]}
    answered = grade(server.url, [("cpp", CPP_SEARCH.replace("OFFSET", "3"))], label)
    assert answered["rewards"] == [0.5]


# The secret is found nowhere the program can look: another uid's descriptors and memory, the
# files of the sandbox, its own memory (its process was forked from the supervisor's). It
# signals every other process it sees, then plays fair: only a fair game passes.
SNOOP = r"""
import gc, os, signal, sys
secret = str(734182955 + 1)
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    for name in ["cmdline", "environ", "mem", *(f"fd/{fd}" for fd in range(8))]:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if secret.encode() in f.read(1 << 20):
                    found.append(name)
        except OSError:
            pass
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        try:
            os.kill(int(pid), sig)
            found.append(f"signalled {pid}")
        except OSError:
            pass
for root, _, names in os.walk("/tmp"):
    for name in names:
        try:
            with open(os.path.join(root, name), "rb") as f:
                found += [name] if secret.encode() in f.read() else []
        except OSError:
            pass
for obj in gc.get_objects():
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    found += ["memory"] if any(isinstance(i, str) and i is not secret and secret in i for i in items) else []
if found:
    print(found, file=sys.stderr)
    sys.exit(42)
""" + PY_SEARCH.replace("FLUSH", "True")


def test_a_program_reaches_neither_the_interactor_nor_its_secret(server: Server) -> None:
    answered = grade(server.url, [("python", SNOOP)], LABEL)
    assert answered["error_types"] == [None] and answered["rewards"] == [1.0]


@pytest.mark.parametrize(
    ("name", "code", "status"),
    [
        # Queries without reading the answers: the pipes fill, the query limit is a wrong answer.
        ("floods queries", "import sys\nwhile True:\n    sys.stdout.write('? 1\\n' * 1000)", "wrong_answer"),
        # Reads nothing, writes nothing: the interactor waits, so does it; the wall limit ends it.
        ("stalls", "import time\ntime.sleep(1000)", "timeout"),
        # Leaves a child behind that the next test must not meet.
        ("outlives", "import os, time\nif os.fork() == 0:\n    time.sleep(1000)\n" + PY_SEARCH.replace("FLUSH", "True"),
         "passed"),
        # Goes on writing after the interactor accepted and exited: the broken pipe ends it, an
        # echo of the acceptance (BAPCtools files its ``guessnoeofcheck`` accepted).
        ("writes after the end", PY_SEARCH.replace("FLUSH", "True") + "while True:\n    print('more', flush=True)\n",
         "passed"),
        # Crashes after the interactor accepted: its own run-time error (Kattis' rule).
        ("crashes after the end", PY_SEARCH.replace("FLUSH", "True") + "raise ValueError('after')\n",
         "runtime_error"),
    ],
)  # fmt: skip
@pytest.mark.timing
def test_attacks_on_the_pipes_end_in_the_programs_verdict(server: Server, name: str, code: str, status: str) -> None:
    started = time.monotonic()
    answered = grade(server.url, [("python", code)], LABEL)
    assert answered["error_types"] == [None if status == "passed" else status], name
    assert time.monotonic() - started < within(60.0)  # three tests, at most their wall limits


@pytest.mark.parametrize(
    "interactor",
    [
        GUESS.replace("registerInteraction(argc, argv);", "registerInteraction(argc, argv); for(;;);"),
        GUESS.replace('quitf(_ok, "guessed', 'for(;;) std::cout << "=" << std::endl;\n quitf(_ok, "guessed'),
        GUESS.replace('quitf(_ok, "guessed in %d queries", queries)', 'quitf(_fail, "broken")'),
        GUESS.replace("long long secret = inf.readLong();", "long long secret = inf.readLong(); sleep(100);").replace(
            "#include <iostream>", "#include <iostream>\n#include <unistd.h>"
        ),
        "int main( {",
    ],
    ids=["loops", "floods", "fails", "sleeps", "does not compile"],
)
def test_a_failing_interactor_leaves_no_verdict(server: Server, interactor: str) -> None:
    label = {"interactor": interactor, "tests": LABEL["tests"][:1]}
    answered = grade(server.url, [("cpp", CPP_SEARCH.replace("OFFSET", "0"))], label)
    assert answered["error_types"] == ["judge_failure"] and math.isnan(answered["rewards"][0])


def test_a_python_interactor_judges_too(server: Server) -> None:
    interactor = """
import sys
secret, limit = int(open(sys.argv[1]).read()), int(open(sys.argv[3]).read())
for queries in range(limit + 1):
    op, x = input().split()
    if op == "!":
        sys.exit(0 if int(x) == secret else 1)
    print("<" if secret < int(x) else ">" if secret > int(x) else "=", flush=True)
sys.exit(1)
"""
    label = {**LABEL, "interactor": {"program": interactor, "language": "python"}}
    answered = grade(server.url, [("cpp", CPP_SEARCH.replace("OFFSET", o)) for o in ("0", "1")], label)
    assert answered["error_types"] == [None, "wrong_answer"]


def test_interactive_samples_are_graded_not_refused_at_their_worst_case(tmp_path) -> None:
    """Admission (the default) at the measured rate: 8 C++ samples of 3 interactive tests (a 15 s
    build and 3 x 2 s of CPU each, the interactor as much again) were a 422 at their worst case on
    2 cores by a 110 s deadline; they are graded."""
    env = {**LANGUAGES_ENV, "SCORER_CODE_ADMISSION": "measured"}
    with gunicorn_server("code", env, threads=8, log_dir=tmp_path) as srv:
        fenced = ["```cpp\nint main(){}\n```"] * 8
        body = {"outputs": fenced, "prompts": ["p"] * 8, "labels": [LABEL] * 8}
        response = requests.post(srv.url + "/reward/score", json=body, timeout=300)
        assert response.status_code == 200, response.text[:300]
        assert response.json()["rewards"] == [0.0] * 8


# Kattis' convention: ``validator input answer feedback_dir``, 42 accepted, 43 rejected; what
# is not a query (the end of the input included) is rejected.
KATTIS_GUESS = """
import os, sys
secret = int(open(sys.argv[1]).read())
with open(os.path.join(sys.argv[3], "judgemessage.txt"), "w") as feedback:
    for queries in range(31):
        words = sys.stdin.readline().split()
        if len(words) != 2 or words[0] not in ("?", "!") or not words[1].isdigit():
            sys.exit(43)
        op, x = words
        feedback.write(f"{op} {x}\\n")
        if op == "!":
            sys.exit(42 if int(x) == secret else 43)
        print("<" if secret < int(x) else ">" if secret > int(x) else "=", flush=True)
sys.exit(43)
"""
# As it was (as many validators are written): it crashes on what is not a query.
FRAGILE_KATTIS_GUESS = KATTIS_GUESS.replace(
    """        words = sys.stdin.readline().split()
        if len(words) != 2 or words[0] not in ("?", "!") or not words[1].isdigit():
            sys.exit(43)
        op, x = words
""",
    "        op, x = input().split()\n",
)
# The program owns /tmp, where the validator's feedback directory is mounted: it cannot take it away.
TAKES_THE_FEEDBACK = """
import os, shutil
for attempt in (lambda: os.rmdir("/tmp/.feedback"), lambda: os.rename("/tmp/.feedback", "/tmp/x"),
                lambda: shutil.rmtree("/tmp/.feedback"), lambda: os.chmod("/tmp/.feedback", 0)):
    try:
        attempt()
    except OSError:
        pass
""" + PY_SEARCH.replace("FLUSH", "True")


def test_a_kattis_validator_interacts(server: Server) -> None:
    label = {**LABEL, "interactor": {"program": KATTIS_GUESS, "language": "python", "protocol": "kattis"}}
    programs = [("cpp", CPP_SEARCH.replace("OFFSET", o)) for o in ("0", "1")] + [("python", TAKES_THE_FEEDBACK)]
    answered = grade(server.url, programs, label)
    assert answered["error_types"] == [None, "wrong_answer", None]


# A child keeps both pipes open after its parent, the program, exits: the interactor waits
# for the rest of a conversation that has ended.
FORKS_AND_EXITS = "import os, time\nprint('? 5', flush=True)\nif os.fork() == 0:\n    time.sleep(1000)\n"
# Whitespace without end: testlib skips it without limit.
BLANKS = "import sys\nwhile True:\n    sys.stdout.write(' ' * 65536)\n"
# testlib's interactor checks its answer for a while (1.5 s of its 2 s of CPU) after the last one.
SLOW_TO_ACCEPT = GUESS.replace(
    "if (x == secret) quitf(_ok,",
    "if (x == secret) for (clock_t t = clock(); clock() - t < 3 * CLOCKS_PER_SEC / 2;);\n"
    "            if (x == secret) quitf(_ok,",
).replace("#include <iostream>", "#include <iostream>\n#include <ctime>")


@pytest.mark.parametrize(
    ("name", "program", "interactor", "status"),
    [
        ("a child keeps the pipes", ("python", FORKS_AND_EXITS), GUESS, "wrong_answer"),
        ("blanks without end", ("python", BLANKS), GUESS, "output_limit"),
        ("blanks without end, cpp", ("cpp", "#include <cstdio>\nint main(){for(;;)putchar(' ');}"), GUESS,
         "output_limit"),
        ("exits before the validator writes", ("python", "pass"),
         {"program": "import time\ntime.sleep(0.5)\nprint('30', flush=True)\n" + FRAGILE_KATTIS_GUESS.strip(),
          "language": "python", "protocol": "kattis"}, "wrong_answer"),
        ("garbage to a validator", ("cpp", '#include <cstdio>\nint main(){puts("hello there");fflush(stdout);'
                                           'char r[4];scanf("%3s",r);}'),
         {"program": FRAGILE_KATTIS_GUESS, "language": "python", "protocol": "kattis"}, "wrong_answer"),
        ("exits at once to a validator", ("python", "pass"),
         {"program": FRAGILE_KATTIS_GUESS, "language": "python", "protocol": "kattis"}, "wrong_answer"),
        ("right, the interactor slow to accept", ("cpp", CPP_SEARCH.replace("OFFSET", "0")), SLOW_TO_ACCEPT, "passed"),
        ("writes after acceptance, cpp", ("cpp", CPP_SEARCH.replace("OFFSET", "0").replace(
            "fflush(stdout);\n}", 'fflush(stdout);\n    for (;;) { puts("more"); fflush(stdout); }\n}')),
         GUESS, "passed"),
    ],
)  # fmt: skip
@pytest.mark.timing
def test_a_program_cannot_end_its_test_without_a_verdict(
    server: Server, name: str, program: tuple[str, str], interactor: object, status: str
) -> None:
    """Whatever the program does to its end of the conversation, the test gets its verdict
    (0 for these wrong ones, 1.0 for the right one), never the judge's failure (NaN)."""
    started = time.monotonic()
    answered = grade(server.url, [program], {"interactor": interactor, "tests": LABEL["tests"][:1]})
    got = (answered["error_types"][0], answered["rewards"][0])
    assert got == (None if status == "passed" else status, float(status == "passed")), name
    assert time.monotonic() - started < within(30.0)


def _outcome(**fields: object) -> InteractOutcome:
    base = dict(index=0, exit=0, timed_out=False, over_memory=False, cpu_s=0.1, wall_s=0.1, stderr="", result="",
                interactor_exit=0, interactor_stopped=False, interactor_report="", interactor_first=False,
                interactor_cpu_s=0.1)  # fmt: skip
    return InteractOutcome(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ("passed", 1.0)),
        ({"interactor_exit": 1}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 2}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 7, "interactor_report": "points 0.25"}, ("wrong_answer", 0.25)),
        ({"interactor_exit": 3}, None),
        ({"interactor_exit": 3, "interactor_first": True}, None),
        ({"interactor_exit": -9, "interactor_stopped": True}, None),
        # The interactor crashed (testlib's unexpected end, a signal): what the program did.
        ({"interactor_exit": 8}, ("wrong_answer", 0.0)),
        ({"interactor_exit": -11, "interactor_first": True}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 120, "exit": -9, "timed_out": True}, ("timeout", 0.0)),
        # The program wrote past its output limit: its verdict, whatever the interactor's.
        ({"output_exceeded": True, "interactor_exit": -9}, ("output_limit", 0.0)),
        ({"output_exceeded": True, "interactor_exit": -9, "interactor_stopped": True}, ("output_limit", 0.0)),
        # A broken pipe after the interactor accepted: the acceptance's echo.
        ({"interactor_first": True, "exit": -13}, ("passed", 1.0)),
        ({"interactor_first": True, "exit": 1, "stderr": "Traceback\nBrokenPipeError: [Errno 32]\n"}, ("passed", 1.0)),
        ({"interactor_first": True, "exit": 1, "stderr": "BrokenPipeError\nValueError: no\n"}, ("runtime_error", 0.0)),
        ({"exit": -13}, ("runtime_error", 0.0)),
        # The interactor ended first with a rejection: the program's failure after it is its echo.
        ({"interactor_exit": 1, "interactor_first": True, "exit": -13}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 1, "interactor_first": True, "timed_out": True}, ("wrong_answer", 0.0)),
        # The interactor failed first: no verdict, whatever the program did after.
        ({"interactor_exit": 3, "interactor_first": True, "exit": 1}, None),
        # The program failed first: its own verdict, whatever the interactor made of it.
        ({"exit": -11, "interactor_exit": 3}, ("runtime_error", 0.0)),
        ({"timed_out": True, "exit": -9, "interactor_exit": 2}, ("timeout", 0.0)),
        ({"over_memory": True, "exit": -9}, ("memory_limit", 0.0)),
        ({"exit": 1, "stderr": "std::bad_alloc"}, ("memory_limit", 0.0)),
        # Accepted first, then the program crashed: Kattis' rule, its own failure.
        ({"interactor_first": True, "exit": -11}, ("runtime_error", 0.0)),
        ({"result": '{"compile_error": "SyntaxError"}', "exit": 1}, ("compile_error", 0.0)),
    ],
)
def test_the_verdicts_precedence(fields: dict, expected: tuple[str, float] | None) -> None:
    assert verdict(_outcome(**fields)) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"interactor_exit": 42}, ("passed", 1.0)),
        ({"interactor_exit": 43}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 0}, None),  # not Kattis' accepted
        ({"interactor_exit": 1, "interactor_first": True}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 0, "interactor_first": True}, None),
        ({"interactor_exit": 43, "interactor_first": True, "exit": 1}, ("wrong_answer", 0.0)),
        ({"interactor_exit": 42, "exit": -11}, ("runtime_error", 0.0)),
    ],
)
def test_a_kattis_validators_exits(fields: dict, expected: tuple[str, float] | None) -> None:
    assert verdict(_outcome(**fields), "kattis") == expected
