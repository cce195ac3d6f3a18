"""SandboxFusion's HTTP API on the code service (its port, its token): ``POST /run_code`` runs
one program on one stdin in a sandbox of its own; ``POST /run_jupyter`` is not served."""
