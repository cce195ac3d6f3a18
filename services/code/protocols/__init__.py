"""The code service's protocols beyond the core's: ``openrlhf`` (OpenRLHF's remote reward) and
``sandbox_fusion`` (SandboxFusion's ``/run_code``, for verl)."""
