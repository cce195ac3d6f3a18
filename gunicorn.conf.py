"""One gunicorn configuration for every scorer service; ``SCORER_SERVICE`` selects it.

- One worker per visible GPU, each pinned with ``CUDA_VISIBLE_DEVICES`` in ``post_fork``; the
  GPU is handed back when the worker exits, so its replacement gets the same one. One worker on
  a CPU-only machine. The master never touches CUDA (no ``preload_app``).
- gthread workers: request threads decode and preprocess in parallel; one inference thread
  per worker batches across them. SIGTERM (or SIGHUP's reload) lets in-flight requests finish
  within ``graceful_timeout`` and refuses new connections at once (``common.server.worker``).
- Prometheus multiprocess mode: each worker writes to a fresh directory, merged on /metrics.
- No control socket: gunicorn's default is one path per user (``~/.gunicorn/gunicorn.ctl``), so
  the services of one node would take it from each other and remove it when one stops.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common.configuration.config import ConfigError, from_env
from common.configuration.settings import CoreSettings
from common.setup import registry

try:
    settings = from_env(CoreSettings)
    registry.read_settings(settings.service)  # the service's own too, before a worker reads them
except ConfigError as exc:  # the variable and what it expects, not a traceback
    sys.exit(f"scorer: {exc}")
service = registry.get(settings.service)
os.environ["SCORER_SERVICE"] = service.name

# Before a worker imports torch: its OpenMP threads then sleep between parallel regions instead
# of spinning. Spinning threads take the cores from the request threads' decoding (and from the
# other services of the node): a request to a tiny PickScore cost 76-146 ms of CPU spinning, 10 ms
# passive, on 2 shared cores (bench/clip/README.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Before anything imports prometheus_client: its metrics pick their storage at import time.
_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix=f"scorer-{service.name}-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir

from common.configuration.devices import GPU_ENV, visible_gpus  # noqa: E402

gpus = visible_gpus() if service.uses_gpu and settings.device != "cpu" else []

bind = settings.bind or f"0.0.0.0:{settings.port or service.port}"
workers = settings.workers or max(1, len(gpus))
worker_class = "common.server.worker.ScorerWorker"
threads = registry.request_threads(settings.threads, service.name)
backlog = 4096
# The gthread heartbeat comes from the worker's main loop, not the request threads, so a long
# batch does not get a worker killed; a stuck main loop does.
timeout = settings.worker_timeout
graceful_timeout = settings.graceful_timeout
keepalive = 75
wsgi_app = "common.server.app:create_app()"
proc_name = f"scorer-{service.name}"
accesslog = settings.access_log
loglevel = settings.log_level
control_socket_disable = True

# Every connection is a descriptor, and a worker holds up to ``worker_connections`` of them
# (slow and idle ones included): the soft limit (often 1024) goes up to the hard one, and a worker
# takes no more connections than that leaves room for beside its own files (models, pipes).
_soft_files, _hard_files = resource.getrlimit(resource.RLIMIT_NOFILE)
_wanted_files = 1 << 20 if _hard_files == resource.RLIM_INFINITY else _hard_files
if _soft_files != resource.RLIM_INFINITY and _soft_files < _wanted_files:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_wanted_files, _hard_files))
FILES_BESIDE_CONNECTIONS = 1024
worker_connections = max(threads + 1, min(settings.worker_connections, _wanted_files - FILES_BESIDE_CONNECTIONS))

# GPU slot -> the worker holding it (master-side bookkeeping).
_gpu_holders: dict[int, object | None] = {slot: None for slot in range(len(gpus))}


def on_starting(server) -> None:
    for name in os.listdir(_metrics_dir):
        os.remove(os.path.join(_metrics_dir, name))
    where = f"GPUs {','.join(gpus)}" if gpus else "CPU"
    server.log.info("scorer service %s: %d worker(s) on %s, %d threads each", service.name, workers, where, threads)


def pre_fork(server, worker) -> None:
    """Pick a free GPU slot in the master, before the fork, so the child inherits it."""
    if not gpus:
        worker.gpu_slot = None
        return
    free = [slot for slot, holder in _gpu_holders.items() if holder is None]
    worker.gpu_slot = free[0] if free else len(server.WORKERS) % len(gpus)
    _gpu_holders[worker.gpu_slot] = worker


def post_fork(server, worker) -> None:
    if worker.gpu_slot is not None:
        gpu = gpus[worker.gpu_slot]
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        os.environ[GPU_ENV] = gpu
        server.log.info("worker %d pinned to GPU %s", worker.pid, gpu)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.pop(GPU_ENV, None)


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
    if getattr(worker, "gpu_slot", None) is not None and _gpu_holders.get(worker.gpu_slot) is worker:
        _gpu_holders[worker.gpu_slot] = None
    _clean_up_after_workers(server)


def _clean_up_after_workers(server) -> None:
    """The service's clean-up of what exited workers left (``registry.Service.worker_exited``)."""
    if service.worker_exited:
        try:
            registry.load_class(service.worker_exited)()
        except Exception:  # the master serves on whatever a clean-up meets
            server.log.exception("cleaning up after the service's workers failed")


def on_exit(server) -> None:
    shutil.rmtree(_metrics_dir, ignore_errors=True)
    if service.worker_exited:
        _wait_for_killed_workers(server, KILLED_WORKER_WAIT_S)
        _clean_up_after_workers(server)


# How long the master, stopping, waits for the workers its grace period's end killed to be gone.
KILLED_WORKER_WAIT_S = 10.0


def _wait_for_killed_workers(server, wait_s: float) -> None:
    """gunicorn's stop kills the workers still running when the grace period ends and reaps only
    those already gone: a killed worker takes a moment to exit, and what it leaves can be
    cleaned up only once it has (``child_exit`` never runs for it)."""
    deadline = time.monotonic() + wait_s
    pending = set(server.WORKERS)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                gone = os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:
                gone = True
            if gone:
                pending.discard(pid)
        if pending:
            time.sleep(0.05)
