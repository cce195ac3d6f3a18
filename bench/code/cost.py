"""What a sample costs in CPU: the time every process of the run spent (the server side, the
zygote, each sample's init, candidate and kernel work done in them), per sample, while 64
call-based samples are graded at once in-process (no HTTP), in another checkout (``--before``)
and in this one with cgroups on and off, rounds interleaved, medians.

    git worktree add /tmp/before <commit>
    sudo python -m bench.code.cost --before /tmp/before [--rounds 3] [--batches 3]

The run's CPU is read from a cgroup it makes for itself (cgroup v1 ``cpuacct``, or v2's
``cpu.stat``; root only), so other jobs on a shared machine do not count, as they do in a
samples/s figure. Not counted: work the kernel defers to its own threads (a network
namespace's teardown: about 1 ms a sample here, see bench/code/README.md).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.code.before_after import run_in_sandbox_tree, sandbox_designs

# Run inside a checkout (cwd): joins a CPU-accounting cgroup of its own, grades ``batches``
# batches of 64 coin_change samples (the bench's six solutions), each as its own request,
# and prints the run's CPU and wall time per sample and the scores it got.
RUNNER = """
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from bench.code.bench import SOLUTIONS, samples
from services.code.environments import load
from services.code.grading.grader import Grader, Sample
from services.code.sandbox.host import Sandbox
from services.code.settings import CodeSettings

batches, cgroups, uid_base = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if os.path.isdir("/sys/fs/cgroup/cpuacct"):
    parent, usage = "/sys/fs/cgroup/cpuacct", lambda d: int(open(d + "/cpuacct.usage").read()) / 1e9
else:
    own = open("/proc/self/cgroup").read().splitlines()[-1].split(":", 2)[2]
    parent = "/sys/fs/cgroup" + own.rstrip("/")
    usage = lambda d: int(open(d + "/cpu.stat").read().split()[1]) / 1e6
account = f"{parent}/bench-cost-{os.getpid()}"
os.mkdir(account)
with open(account + "/cgroup.procs", "w") as procs:
    procs.write("0")  # this process and all it forks from now on
fields = {"infra_failure_score": "nan", "max_parallel": 8, "uid_base": uid_base, "cgroups": cgroups}
settings = CodeSettings(**fields)
sandbox = Sandbox("bwrap", settings.parallel, settings.uid_base, settings.cgroups)
sandbox.start()
grader = Grader(settings, sandbox, 150.0)
env = load("coin_change")
names = samples(64)
one = lambda name: grader.grade([Sample(SOLUTIONS[name], env.suite)])[0].score
for _ in range(3):
    one("dp")
with ThreadPoolExecutor(64) as pool:
    cpu, started = usage(account), time.perf_counter()
    scores = [score for _ in range(batches) for score in pool.map(one, names)]
    cpu, wall = usage(account) - cpu, time.perf_counter() - started
sandbox.close()
with open(parent + "/cgroup.procs", "w") as procs:
    procs.write("0")
for _ in range(200):  # the zygote's last processes may take a moment to exit
    try:
        os.rmdir(account)
        break
    except OSError:
        time.sleep(0.05)
print(json.dumps({"cpu_ms": 1000 * cpu / len(scores), "wall_ms": 1000 * wall / len(scores), "scores": scores[:64]}))
"""


def run(tree: Path, batches: int, cgroups: str, uid_base: int) -> dict:
    return run_in_sandbox_tree(tree, RUNNER, str(batches), cgroups, str(uid_base))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier code")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3, help="batches of 64 samples per round and design")
    parser.add_argument("--uid-base", type=int, default=400000)
    args = parser.parse_args()
    designs = sandbox_designs(args.before, "auto")
    results: dict[str, list[dict]] = {name: [] for name in designs}
    for _ in range(args.rounds):
        for name, (tree, cgroups) in designs.items():
            results[name].append(run(tree, args.batches, cgroups, args.uid_base))
    want = results[f"before ({args.before})"][0]["scores"]
    print(f"64 call-based samples at once, {args.batches} batches per round, {args.rounds} rounds, medians")
    print("| design | CPU per sample (ms) | wall per sample (ms) | scores agree |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        wall = statistics.median(r["wall_ms"] for r in runs)
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {all(r['scores'] == want for r in runs)} |")


if __name__ == "__main__":
    main()
