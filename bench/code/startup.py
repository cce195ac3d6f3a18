"""What each language's runtime costs: per test, the CPU time (all its processes and
threads, as the limits count it) and the wall time of a trivial program (A+B: the runtime's
start) and of a CPU-bound one (a sieve counting the primes up to ``--sieve``, written the
same plain way in each language), built once, then run ``--tests`` times per round through
the sandbox in-process (no HTTP), languages interleaved, medians. What a language spends
beyond C is what its ``time_scales`` entry (``SCORER_CODE_TIME_SCALES``) pays for: the
start as seconds, the slower steady state as a factor.

    python -m bench.code.startup [--rounds 3] [--tests 5] [--sieve 20000000]
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from services.code import languages
from services.code.grading.grader import Grader
from services.code.sandbox.compile_cache import SANDBOX_VIEW, Builds, CompileCache, Limits
from services.code.sandbox.host import Sandbox
from services.code.settings import CodeSettings
from testing.code_cases import CASES

PYTHON_APLUSB = "a, b = map(int, input().split())\nprint(a + b)"
# The primes up to n (read from stdin), by a byte-per-number sieve.
SIEVES = {
    languages.PYTHON: "n=int(input())\ns=bytearray(n+1)\nc=0\nfor i in range(2,n+1):\n if not s[i]:\n  c+=1\n"
                      "  for j in range(i*i,n+1,i):s[j]=1\nprint(c)",
    "c": "#include <stdio.h>\n#include <stdlib.h>\nint main(){long n;scanf(\"%ld\",&n);char*s=calloc(n+1,1);long c=0;"
         "for(long i=2;i<=n;i++)if(!s[i]){c++;for(long j=i*i;j<=n;j+=i)s[j]=1;}printf(\"%ld\\n\",c);}",
    "cpp": "#include <bits/stdc++.h>\nint main(){long n;std::cin>>n;std::vector<char>s(n+1);long c=0;"
           "for(long i=2;i<=n;i++)if(!s[i]){c++;for(long j=i*i;j<=n;j+=i)s[j]=1;}std::cout<<c<<'\\n';}",
    "java": "import java.util.*;\npublic class Main{public static void main(String[] a){long n=new Scanner(System.in)"
            ".nextLong();boolean[] s=new boolean[(int)n+1];long c=0;for(long i=2;i<=n;i++)if(!s[(int)i]){c++;"
            "for(long j=i*i;j<=n;j+=i)s[(int)j]=true;}System.out.println(c);}}",
    "go": "package main\nimport \"fmt\"\nfunc main(){var n int\nfmt.Scan(&n)\ns:=make([]bool,n+1)\nc:=0\n"
          "for i:=2;i<=n;i++{if !s[i]{c++\nfor j:=i*i;j<=n;j+=i{s[j]=true}}}\nfmt.Println(c)}",
    "rust": "use std::io::*;\nfn main(){let mut t=String::new();stdin().read_to_string(&mut t).unwrap();"
            "let n:usize=t.trim().parse().unwrap();let mut s=vec![false;n+1];let mut c=0;for i in 2..=n{if !s[i]{"
            "c+=1;let mut j=i*i;while j<=n{s[j]=true;j+=i;}}}println!(\"{}\",c);}",
    "javascript": "const n=Number(require('fs').readFileSync(0,'utf8'));const s=new Uint8Array(n+1);let c=0;"
                  "for(let i=2;i<=n;i++)if(!s[i]){c++;for(let j=i*i;j<=n;j+=i)s[j]=1;}console.log(c);",
}  # fmt: skip


def sources() -> dict[str, dict[str, str]]:
    """Per language with its toolchain here: its A+B program (the language tests') and its sieve."""
    tools = languages.tool_paths()
    found = {languages.PYTHON: {"A+B": PYTHON_APLUSB, "sieve": SIEVES[languages.PYTHON]}}
    for name, cases in CASES.items():
        if not languages.missing_tools(languages.LANGUAGES[name], tools):
            found[name] = {"A+B": cases[0][2], "sieve": SIEVES[name]}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tests", type=int, default=5)
    parser.add_argument("--sieve", type=int, default=20_000_000)
    parser.add_argument("--python-sieve", type=int, default=2_000_000, help="a smaller n for Python")
    parser.add_argument("--uid-base", type=int, default=410000)
    args = parser.parse_args()
    settings = CodeSettings(infra_failure_score="nan", max_parallel=8, uid_base=args.uid_base, time_scales="",
                            test_cpu_s=60, test_wall_s=60, sample_wall_s=600)  # fmt: skip
    cache = CompileCache(settings.compile_cache_mb << 20, "bwrap")
    limits = Limits(settings.compile_cpu_s, settings.compile_wall_s, settings.compile_memory_mb,
                                  settings.compile_tmp_mb)  # fmt: skip
    binds = ("--bind", cache.root, SANDBOX_VIEW, *languages.TOOLCHAIN_BINDS)
    sandbox = Sandbox("bwrap", settings.parallel, settings.uid_base, settings.cgroups, "", binds)
    sandbox.start()
    try:
        grader = Grader(settings, sandbox, 300.0, Builds(cache, limits))
        programs = sources()
        # Fresh builds (a comment no earlier run had): the rounds then hit them.
        salt = uuid.uuid4().hex
        inputs = {"A+B": "1 2\n", "sieve": f"{args.sieve}\n"}
        cpu: dict[tuple[str, str], list[float]] = {}
        wall: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, cases in programs.items():
                for case, code in cases.items():
                    comment = "#" if name == languages.PYTHON else "//"
                    given = f"{args.python_sieve}\n" if (name, case) == (languages.PYTHON, "sieve") else inputs[case]
                    for run in grader.trial(f"{code}\n{comment} {salt}\n", name, [given] * args.tests):
                        assert run.exit == 0 and not run.timed_out, (name, case, run.stderr[-300:])
                        cpu.setdefault((name, case), []).append(run.cpu_s)
                        wall.setdefault((name, case), []).append(run.wall_s)
    finally:
        sandbox.close()
        cache.close()
    print(f"{args.rounds} rounds x {args.tests} runs; sieve n={args.sieve:,} (Python: {args.python_sieve:,});"
          " medians (max) in ms; x C: the sieve's CPU over C's")  # fmt: skip
    print("| language | A+B CPU | A+B wall | sieve CPU | sieve wall | sieve CPU x C |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(cpu[("c", "sieve")])
    for name in programs:
        cells = []
        for case in ("A+B", "sieve"):
            for found in (cpu[(name, case)], wall[(name, case)]):
                cells.append(f"{1000 * statistics.median(found):.0f} ({1000 * max(found):.0f})")
        ratio = statistics.median(cpu[(name, "sieve")]) / base
        if name == languages.PYTHON:
            ratio *= args.sieve / args.python_sieve
        print(f"| {name} | {' | '.join(cells)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
