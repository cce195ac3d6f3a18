"""Settings and the node: ``SCORER_*`` read into typed, declared settings (``config``), the
core's settings (``settings``), the GPUs (``devices``) and CPUs (``cpus``) this process may use.

Standard library only (``run.sh`` and the gunicorn master read it before any virtual
environment or CUDA); imports ``common.limits`` alone."""
