"""Runs inside .venv-deepgym: grade solutions with DeepGym 0.6.2's local mode (bubblewrap).

stdin: {"env": name, "solutions": [str], "max_parallel": int}; stdout: {"scores", "seconds"}.
"""

import json
import sys
import time

from deepgym import DeepGym, load_environment

job = json.load(sys.stdin)
gym = DeepGym(mode="local")
env = load_environment(job["env"])
gym.run(env, job["solutions"][0])  # warm-up, as the other designs get theirs
start = time.perf_counter()
batch = gym.run_batch(env, job["solutions"], max_parallel=job["max_parallel"])
seconds = time.perf_counter() - start
json.dump({"scores": [r.score for r in batch.results], "seconds": seconds}, sys.stdout)
