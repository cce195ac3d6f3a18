"""A sample's way to its verdict, in the service: ``grader`` (a sample's admission, slot, plan,
re-run and score), ``modes`` (how its tests are judged, one strategy per mode), ``runner`` (a
run's job, limits and slot), ``build_step`` (a program's build through the compile cache),
``checker_runs`` (a label's custom checker or interactor: built
before the program runs, the checker run on what each test printed), ``trials`` (unjudged runs:
``/run_code``, the startup checks)."""
