"""What a test's outcome means, decided in the service from what the sandbox reported:
``statuses`` (an outcome into its status), ``comparison`` (the one rule for outputs and call
results), ``checkers`` (a label's ``"checker"``: its modes, a custom checker's exit),
``kattis_default`` (Kattis' default output validator), ``interactor`` (a label's interactor: its
job and its verdict)."""
