"""The code verifier: runs the last code block of each response against its tests, sandboxed.

Two protocols reach the same grader: the core's pickle/JSON route
(``{"responses", "prompts", "labels", "metadata"}`` -> ``{"scores", "error_types"}``) and
OpenRLHF's remote reward route (``protocols.openrlhf``).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from common.configuration.config import ConfigError, env_name, from_env
from common.configuration.cpus import usable_cpus
from common.configuration.settings import CoreSettings
from common.limits.clients import current_client, hang_up_check
from common.limits.deadlines import Deadline, current_deadline
from common.limits.errors import Overloaded, PayloadTooLarge, Unprocessable, quote
from common.pipeline.scorer import Scored, Scorer
from services.code import environments, languages, packages
from services.code.extract import extract_program, response_from_query
from services.code.grading.grader import Grader, Sample
from services.code.judging.statuses import Verdict
from services.code.labels import code_validation, problem_packages
from services.code.labels.suites import Suite, label_code_of, parse_label, with_checked_code
from services.code.preflight import preflight
from services.code.protocols.sandbox_fusion import api as sandbox_fusion
from services.code.sandbox import host
from services.code.sandbox.compile_cache import SANDBOX_VIEW, Builds, CompileCache, Limits
from services.code.scheduling.cancelling import Cancelled
from services.code.settings import CodeSettings

log = logging.getLogger(__name__)

# Modules a graded program must be able to import (several load C extensions, and a non-ASCII
# identifier loads unicodedata): checked at startup as a sandbox uid.
STDLIB_MODULES = (
    "array", "bisect", "collections", "copy", "ctypes", "dataclasses", "datetime", "decimal", "enum", "fractions",
    "functools", "hashlib", "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics",
    "string", "struct", "typing", "unicodedata", "zlib",
)  # fmt: skip
REPOSITORY = Path(__file__).resolve().parents[2]
# The most decimal digits an integer of a request may have (CPython's default is 4,300).
# Parsing one costs time quadratic in its digits: 16 ns a digit at 4,300, 71 at 20,000, 357
# at 100,000, so a body of such integers costs at most about 4.5 times what it costs at the
# default. A program's answers and arguments cross as hexadecimal past 4,300 digits (linear).
INT_MAX_DIGITS = 20_000
# Prints what is wrong, or "ok".
STARTUP_PROBE = """
import os
broken = []
for name in {modules!r}:
    try:
        __import__(name)
    except BaseException as exc:
        broken.append(f"{{name}} ({{type(exc).__name__}}: {{exc}})")
try:
    exec("é = 1")
except BaseException as exc:
    broken.append(f"a non-ASCII identifier ({{type(exc).__name__}}: {{exc}})")
if broken:
    print("cannot import: " + "; ".join(broken))
elif os.path.exists({repository!r}):
    print("can see the checkout, " + {repository!r})
else:
    print("ok")
"""

SECTION = "code"
# Helper processes per worker that compile label code (at most one per core).
LABEL_HELPERS = 4


def _label_text(label: Any) -> Any:
    """A label as the text caps count it: a string as it is, a dict or list as its JSON."""
    if label is None or isinstance(label, str):
        return label or ""
    try:
        return json.dumps(label, default=str)
    except (ValueError, TypeError, RecursionError):
        raise Unprocessable("labels: a label must be plain JSON data") from None


class Graded(Scored):
    """A sample's reward with the verdict behind it (the OpenRLHF answer reports its rates)."""

    def __init__(self, score: float, verdict: Verdict) -> None:
        budget = None if verdict.budget_s is None else round(verdict.budget_s, 3)
        super().__init__(score, {"error_types": None if verdict.status == "passed" else verdict.status,
                                 "time_budget_s": budget})  # fmt: skip
        self.verdict = verdict


class CodeScorer(Scorer):
    name = "code"
    batched = False

    def __init__(self, core: CoreSettings) -> None:
        super().__init__(core)
        self.settings = from_env(CodeSettings, SECTION)
        s = self.settings
        if s.request_timeout_s is not None:
            log.warning(
                "%s is deprecated: the deadline of every request is SCORER_REQUEST_TIMEOUT_S",
                env_name(SECTION, "request_timeout_s"),
            )
            if "SCORER_REQUEST_TIMEOUT_S" not in os.environ:
                self.core = replace(core, request_timeout_s=s.request_timeout_s)
        problem = preflight()
        if problem:
            raise ConfigError(problem)
        absent = packages.missing(s.sandbox_packages)
        if absent:
            raise ConfigError(
                f"the code sandbox's packages {', '.join(absent)} ({env_name(SECTION, 'sandbox_packages')}) are not "
                f"installed in {packages.PACKAGES_DIR}: `bash run.sh code` installs them, or "
                "`python -m services.code.packages` with the service's interpreter"
            )
        self.environment = self._load_environment(s.env) if s.env else None
        if s.problems_dir and not os.path.isdir(s.problems_dir):
            raise ConfigError(f"{env_name(SECTION, 'problems_dir')}: {s.problems_dir} is not a directory")
        self.problems = problem_packages.Problems(s.problems_dir).suite if s.problems_dir else None
        self.isolation: str | None = None  # chosen in setup
        self.sandbox: host.Sandbox | None = None
        self.grader: Grader | None = None
        helpers = max(1, min(LABEL_HELPERS, usable_cpus()))
        self.label_code = code_validation.LabelCode(helpers, s.label_cache_mb << 20)
        atexit.register(self.label_code.close)

    @staticmethod
    def _load_environment(name: str) -> environments.Environment:
        try:
            return environments.load(name)
        except KeyError as exc:
            raise ConfigError(f"{env_name(SECTION, 'env')}: {exc.args[0]}") from None

    def choose_isolation(self) -> str:
        """The isolation to use, probed (each probe runs a process, so ``setup`` calls this);
        refuses one weaker than bwrap unless the operator named it."""
        wanted = self.settings.sandbox
        if wanted == "auto":
            chosen = host.strongest()
        elif host.available(wanted):
            chosen = wanted
        else:
            raise ConfigError(f"{env_name(SECTION, 'sandbox')}={wanted}: not available on this host")
        if chosen != host.ISOLATIONS[0] and self.settings.allow_weak_sandbox != chosen:
            raise ConfigError(
                f"the strongest code sandbox here is {chosen!r}, weaker than bwrap (install the Debian package "
                f"'bubblewrap'); set {env_name(SECTION, 'allow_weak_sandbox')}={chosen} to accept it"
            )
        return chosen

    def setup(self, device: str) -> None:
        """Choose the isolation, start the warm zygote and grade one known-good program through it."""
        s = self.settings
        # This worker serves the code verifier alone: labels may hold integers past CPython's default.
        sys.set_int_max_str_digits(INT_MAX_DIGITS)
        self.isolation = isolation = self.choose_isolation()
        shown = str(packages.PACKAGES_DIR) if s.sandbox_packages else ""
        cache = CompileCache(s.compile_cache_mb << 20, isolation)
        atexit.register(cache.close)
        builds = Builds(cache, Limits(s.compile_cpu_s, s.compile_wall_s,
                                                                  s.compile_memory_mb, s.compile_tmp_mb))  # fmt: skip
        binds = ("--bind", cache.root, SANDBOX_VIEW, *languages.TOOLCHAIN_BINDS)
        self.sandbox = host.Sandbox(isolation, s.parallel, s.uid_base, s.cgroups, shown, binds)
        atexit.register(self.sandbox.close)
        self.sandbox.start()
        self.grader = Grader(s, self.sandbox, self.core.request_timeout_s, builds)
        probe = Sample("print(input())", Suite("stdin", ["ok\n"], ["ok"]))
        verdict = self.grader.grade([probe])[0]
        if verdict.status != "passed":
            raise RuntimeError(f"the code sandbox failed its self-check: {verdict.status}")
        self._check_what_programs_see()
        log.warning(
            "code sandbox isolation: %s (uids %d-%d, %d slots); resource limits: %s; environment: %s; languages: %s",
            isolation, self.sandbox.uids[0], self.sandbox.uids[-1], s.parallel,
            self.sandbox.cgroups.describe(), s.env or "none",
            ", ".join(f"{name} {state}" for name, state in builds.availability().items()),
        )  # fmt: skip

    def _check_what_programs_see(self) -> None:
        """Refuse to start unless a sandbox uid imports the standard library and, in bwrap,
        cannot see the checkout."""
        assert self.grader is not None
        modules = (*STDLIB_MODULES, *packages.top_level_modules(self.settings.sandbox_packages))
        [run] = self.grader.trial(STARTUP_PROBE.format(modules=modules, repository=str(REPOSITORY)))
        said = run.stdout.strip()
        if said == "ok" or (self.isolation != "bwrap" and said.startswith("can see the checkout")):
            return
        interpreter = os.path.realpath(sys.executable)
        error = "" if said else ": " + (run.stderr + run.result)[-500:]
        raise RuntimeError(
            f"the code sandbox's programs (uid {self.grader.sandbox.uids[0]}) {said or 'failed'}{error}. "
            f"Packages beyond the standard library come from {packages.PACKAGES_DIR}. "
            f"The interpreter {interpreter} "
            f"(its prefix and standard library: {', '.join(host.interpreter_dirs())}) must be readable "
            "by every uid; with bubblewrap only those directories are shown to programs, with a weaker "
            "sandbox the host's own permissions apply (a Python under a 0700 home directory fails)"
        )

    # -- requests -----------------------------------------------------------------------

    def samples(
        self, responses: list[Any], prompts: Any, labels: Any, from_query: bool, language: Any = None
    ) -> list[Sample]:
        """Validate one request's lists and turn them into samples (422 on bad input);
        ``language``: the request's, for samples whose label names none."""
        s = self.settings
        wanted = languages.language_of(language) if language is not None else None
        if language is not None and wanted is None:
            raise Unprocessable(f"unknown language {str(language)[:40]!r}")
        if not isinstance(responses, list):
            raise Unprocessable("the responses must be a list of strings")
        if prompts is None:
            raise Unprocessable("'prompts' is required (one per sample)")
        labels = [None] * len(responses) if labels is None else labels
        if not isinstance(prompts, list) or not isinstance(labels, list):
            raise Unprocessable("'prompts' and 'labels' must be lists")
        if not len(responses) == len(prompts) == len(labels):
            raise Unprocessable(
                f"list lengths differ: {len(responses)} responses, {len(prompts)} prompts, {len(labels)} labels"
            )
        if len(responses) > s.max_samples:
            raise Unprocessable(f"{len(responses)} samples; the limit is {s.max_samples} per request")
        total = 0
        for text in (*responses, *prompts, *map(_label_text, labels)):
            if not isinstance(text, str):
                raise Unprocessable("every response/query and prompt must be a string")
            if len(text) > s.max_text_chars:
                raise Unprocessable(f"a text of {len(text)} characters; the limit is {s.max_text_chars}")
            total += len(text)
        if total > s.max_request_chars:
            raise Unprocessable(f"{total} characters in the request; the limit is {s.max_request_chars}")
        samples = [self._sample(r, p, label, from_query, wanted) for r, p, label in zip(responses, prompts, labels)]
        return self._with_checked_code(samples)

    def _with_checked_code(self, samples: list[Sample]) -> list[Sample]:
        """The samples, their assert labels' code compiled (in ``code_validation``'s helpers) first."""
        codes = {id(s.suite): label_code_of(s.suite) for s in samples if s.suite is not None}
        for code in codes.values():
            if sum(map(len, code)) > self.settings.max_label_code_chars:
                raise PayloadTooLarge(
                    f"a label of {sum(map(len, code))} characters of code; the limit is "
                    f"{self.settings.max_label_code_chars} ({env_name(SECTION, 'max_label_code_chars')})"
                )
        wanted = [piece for code in codes.values() for piece in code]
        if not wanted:
            return samples
        checked = self.label_code.check(wanted, current_deadline() or Deadline(self.core.request_timeout_s))
        return [
            s if s.suite is None else replace(s, suite=with_checked_code(s.suite, lambda c: checked[c].defines_check))
            for s in samples
        ]

    def _sample(self, text: str, prompt: str, label: Any, from_query: bool, wanted: str | None = None) -> Sample:
        suite = self._suite(label)
        response = response_from_query(text, prompt) if from_query else text
        if response is None:
            log.warning("prompt not found in its query (%d chars); the sample gets no verdict", len(text))
            return Sample("", None)
        # The label's language, else the request's, else the fenced block's, else Python.
        tagged, code = extract_program(response, suite.language or wanted)
        language = suite.language or wanted or tagged or languages.PYTHON
        if language != languages.PYTHON and suite.kind != "stdin" and not suite.invalid:
            suite = dataclasses.replace(suite, invalid=f"{language} programs are graded on stdin/stdout tests only")
        return Sample(code, suite, language)

    def _suite(self, label: Any) -> Suite:
        parsed = parse_label(label, self.problems)
        if isinstance(parsed, Suite):
            return parsed
        if self.environment is None:
            raise Unprocessable(
                f"a label has no tests and this server has no environment ({env_name(SECTION, 'env')} / --env)"
            )
        if parsed and parsed != self.environment.name:
            raise Unprocessable(
                f"label asks for environment {quote(parsed)}; this server serves {self.environment.name!r}"
            )
        return self.environment.suite

    def prepare(self, payload: dict[str, Any]) -> list[Sample]:
        if "responses" not in payload:
            raise Unprocessable("body needs 'responses' (one string per sample), 'prompts' and 'labels'")
        return self.samples(
            payload["responses"], payload.get("prompts"), payload.get("labels"), False, payload.get("language")
        )

    def grade(self, samples: Sequence[Sample]) -> list[Verdict]:
        if self.grader is None:
            raise RuntimeError("the code sandbox is not started")
        if not samples:
            return []
        return self.grader.grade(samples, current_deadline(), current_client(), hang_up_check())

    def reward(self, verdict: Verdict) -> float:
        """A verdict's reward; a sample without one gets ``infra_failure_score``."""
        if verdict.score is not None:
            return verdict.score
        return math.nan if self.settings.infra_failure_score == "nan" else 0.0

    def score_request(self, items: Sequence[Sample | sandbox_fusion.RunCode]) -> list[Scored]:
        """Sandboxed runs, under the grader's own slot limit rather than a batcher: samples
        graded, or SandboxFusion's runs (``sandbox_fusion``) answered unjudged."""
        if items and isinstance(items[0], sandbox_fusion.RunCode):
            return [self.run_code(item) for item in items]  # type: ignore[arg-type]
        return [Graded(self.reward(v), v) for v in self.grade(items)]  # type: ignore[arg-type]

    def run_code(self, request: sandbox_fusion.RunCode) -> sandbox_fusion.Ran:
        """One ``/run_code`` run by the request's deadline and its client's read timeout, in its
        client's turn at the slots."""
        if self.grader is None:
            raise RuntimeError("the code sandbox is not started")
        deadline = current_deadline() or Deadline(self.core.request_timeout_s)
        answer_by = min(deadline.expires, deadline.expires - deadline.seconds + request.answer_s)
        try:
            return sandbox_fusion.Ran(sandbox_fusion.run(self.grader, request, answer_by, hang_up_check()))
        except host.SandboxFailure as exc:
            raise Overloaded(f"the sandbox could not make the run ({exc}); retry") from exc
        except Cancelled as exc:  # the answer reaches no one
            raise Overloaded("the client hung up: its run was stopped") from exc

    def info(self) -> dict[str, Any]:
        return {
            "isolation": self.isolation,
            "resource_limits": self.sandbox.cgroups.describe() if self.sandbox else None,
            "languages": self.grader.builds.availability() if self.grader and self.grader.builds else None,
            "toolchains": self.grader.builds.toolchains() if self.grader and self.grader.builds else None,
            "compile_cache": self.grader.builds.cache.stats() if self.grader and self.grader.builds else None,
            "label_cache": self.label_code.stats(),
            "admission": self.grader.admission_stats() if self.grader else None,
            "time_limits": self.grader.time_limits() if self.grader else None,
            "parallel": self.settings.parallel,
            "environment": self.settings.env or None,
            "environments": environments.names(),
            "settings": asdict(self.settings),
        }
