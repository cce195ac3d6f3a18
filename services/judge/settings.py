"""Settings of the VLM judges; each is ``SCORER_JUDGE_<FIELD>`` in the environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.configuration.config import ConfigError, above, at_least, env_name, from_env, setting

SECTION = "judge"
# The judge that compares samples in pairs; the others score each alone.
PAIRWISE = "unifiedreward-think"
PARSE_FAILURE_HELP = (
    f"{env_name(SECTION, 'parse_failure_score')} (run.sh judge --parse-failure-score) must be set to 'nan', "
    "'zero', 'tie' or 'mean': the score of a sample whose judge reply does not parse. 'nan' (with the reply's "
    "error in error_types) lets the trainer drop it; 'zero' is flow_grpo's and VeRL-Omni's convention, which "
    "teaches the policy to avoid whatever made the judge ramble; 'tie' counts a pairwise comparison as half a "
    "win each (the pairwise judge only); 'mean' gives it the mean of the request's parsed scores. There "
    "is no default because the right choice depends on the trainer."
)


@dataclass(frozen=True)
class JudgeSettings:
    judge: Literal["unifiedreward", "unifiedreward-v1", "unifiedreward-think", "vlm-ocr", "qwenvl"] = setting(
        "unifiedreward", "which judge: the published prompt and reply rule", flag=True
    )
    engine: str = setting(
        "",
        "the OpenAI-compatible engine's base URL (`http://HOST:PORT`, its `/v1/chat/completions` beneath)",
        flag=True,
    )
    model: str = setting(
        "", "the engine's model name", flag=True, shown_default="the first model the engine's `/v1/models` lists"
    )
    # No default on purpose (PARSE_FAILURE_HELP).
    parse_failure_score: Literal["nan", "zero", "tie", "mean"] | None = setting(
        None,
        "what a sample whose reply does not parse scores: `nan`, `zero`, `tie` or `mean`",
        flag=True,
        shown_default="none: required",
    )
    # Chat completions one worker has in flight at once, across its requests.
    concurrency: int = setting(
        64, "chat completions one worker has in flight at once, across its requests", check=at_least(1)
    )
    # Retries of a call the engine answered 429 or 5xx, or could not be reached for, each after
    # backoff_s doubling up to backoff_max_s, never past the request's deadline.
    retries: int = setting(3, "retries of a call the engine answered 429/5xx or could not be reached for")
    backoff_s: float = setting(0.5, "the first retry's pause, doubling")
    backoff_max_s: float = setting(4.0, "the longest pause between retries")
    # Pairwise: judge each pair in both orders (position bias cancels), twice the calls.
    both_orders: bool = setting(False, "pairwise: judge each pair in both orders")
    # Pairwise: comparisons (engine calls) one request may ask for, checked before any is sent
    # (413): a group of n samples is n(n-1)/2 pairs, 523,776 for one group of 1,024.
    max_comparisons: int = setting(
        1024,
        "pairwise: engine calls one request may ask for (413 beyond, before any is sent; a group of n is n(n-1)/2 "
        "pairs)",
    )
    # /ready asks the engine itself only when no call has shown for this long whether it answers,
    # and then in the background: a balancer polling /ready never sends the engine a call per poll.
    ready_probe_s: float = setting(
        10.0,
        "how long the engine's calls may show nothing before `/ready` probes it (one probe at a time)",
        check=above(0),
    )
    # How long a starting worker waits for the engine to list its models (a vLLM load takes minutes).
    engine_wait_s: float = setting(600.0, "how long a starting worker waits for the engine to list its models")
    api_key: str | None = setting(None, "a bearer token for the engine, if it wants one", secret=True)
    # ``engine`` and ``model`` then follow the child.
    serve: str = setting(
        "",
        "a model directory or hub id: start the engine as a child of the service, wait for it, and stop it with "
        "the service",
        flag=True,
    )
    # The child engine's command: {model}, {port} and {gpus} (the node's visible GPUs) filled in.
    # vLLM's own environment, installed only on the GPU node, must have ``vllm`` on PATH.
    serve_command: str = setting(
        "vllm serve {model} --host 127.0.0.1 --port {port} --data-parallel-size {gpus} "
        "--limit-mm-per-prompt.image 32 --enable-prefix-caching --trust-remote-code",
        "the child engine's command (`{gpus}`: the node's visible GPUs)",
    )


def settings_problem(settings: JudgeSettings) -> str | None:
    """Why the judge cannot start with these settings; None when it can."""
    if not settings.engine and not settings.serve:
        return (
            f"{env_name(SECTION, 'engine')} (run.sh judge --engine URL) must name the OpenAI-compatible "
            "engine serving the judge model, e.g. http://127.0.0.1:8000 (or --serve MODEL to start vLLM as its child)"
        )
    if settings.parse_failure_score is None:
        return PARSE_FAILURE_HELP
    if settings.parse_failure_score == "tie" and settings.judge != PAIRWISE:
        return f"{env_name(SECTION, 'parse_failure_score')}=tie applies to the pairwise judge ({PAIRWISE}) only"
    return None


def preflight(service: str = SECTION) -> str | None:
    """Why the judge cannot start here: its settings (standard library only, as run.sh calls it)."""
    try:
        return settings_problem(from_env(JudgeSettings, SECTION))
    except ConfigError as exc:
        return str(exc)
