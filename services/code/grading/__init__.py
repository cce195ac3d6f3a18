"""From a sample to a verdict, one step a module: ``runner`` (a run's job, limits and slot),
``building`` (a program's build through the compile cache), ``judging`` (a test's outcome into
its status), ``checking`` (a label's custom checker or interactor), ``trials`` (unjudged runs:
``/run_code``, the startup checks); ``services.code.grader`` puts a sample's steps together."""
