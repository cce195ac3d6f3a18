"""What a sample's tests are: ``suites`` (a label into a ``Suite``: what enters the sandbox and
what never does), ``code_validation`` (an assert label's Python code compiled in helper
processes before any sample runs it), ``problem_packages`` (Kattis problem packages a label
names)."""
