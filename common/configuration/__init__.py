"""Settings and the node: ``SCORER_*`` read into typed, declared settings (``config``), the
core's settings (``settings``), the GPUs (``devices``) and CPUs (``cpus``) this process may use.

Standard library only when imported (``run.sh`` and the gunicorn master read it before any
virtual environment or CUDA; torch only inside ``devices.require_torch_device``); imports
``common.limits`` alone."""
