"""Which rewards a ``multi`` request sums, and with which weights: the URL's query
(``?ocr=0.7&pickscore=0.3``, ``!optional`` after a weight: its reward's failure drops it instead
of failing the request), which wins, else ``metadata["rewards"]`` (``{"ocr": 0.7, "pickscore":
{"weight": 0.3, "optional": true}}``), else every served reward with weight 1. A reward may be
named by an alias its scorer gives (flow_grpo's name for it: ``qwenvl``, ``unifiedreward`` for
the judge serving them), its ``details`` then keyed by that name. The clients write the query
with ``common.sdk.rewards.rewards_url``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.limits.errors import Unprocessable, quote
from common.sdk.rewards import OPTIONAL


@dataclass(frozen=True)
class Wanted:
    """One requested reward: its weight in the sum, whether its failure only drops it, and the
    alias the request named it by (its key in the answer's ``details``), if any."""

    weight: float
    optional: bool = False
    alias: str = ""


def _weight(value: Any, where: str) -> float:
    """A finite number (a bool is not one); 422 otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unprocessable(f"{where} = {quote(value)} must be a finite number")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = math.inf
    if not math.isfinite(number):
        raise Unprocessable(f"{where} = {quote(value)} must be a finite number")
    return number


# A weight in the URL: a plain decimal number, as a JSON number is written (``float`` also takes
# ``1_0``, spaces and digits of other scripts, which no client means).
DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def _query_weight(text: str, where: str) -> float:
    """The query's text of a finite decimal number; 422 otherwise."""
    if not DECIMAL.fullmatch(text):
        raise Unprocessable(f"{where} = {quote(text)} is not a number")
    return _weight(float(text), where)


def _served(name: Any, served: Sequence[str], aliases: Mapping[str, str], where: str) -> str:
    """The served reward ``name`` names, itself or by an alias; 422 otherwise."""
    if name in served:
        return name
    if isinstance(name, str) and name in aliases:
        return aliases[name]
    also = f" (also by the names {', '.join(aliases)})" if aliases else ""
    raise Unprocessable(
        f"{where} names {quote(name)}, not a reward of this service; it serves {', '.join(served)}{also}"
    )


def _add(wanted: dict[str, Wanted], name: str, reward: str, want: Wanted, where: str) -> None:
    """``reward`` (named ``name`` by the request) into ``wanted``; 422 when it is there already."""
    if reward in wanted:
        raise Unprocessable(f"{where} gives {reward!r} twice" + (f" (as {name!r})" if name != reward else ""))
    wanted[reward] = Wanted(want.weight, want.optional, name if name != reward else "")


def from_query(
    query: Sequence[tuple[str, str]], served: Sequence[str], aliases: Mapping[str, str] = {}
) -> dict[str, Wanted]:
    """``?ocr=0.7&pickscore=0.3!optional`` -> the rewards wanted; 422 for an unknown reward, a
    reward given twice or a weight that is not a finite number."""
    wanted: dict[str, Wanted] = {}
    for key, value in query:
        reward = _served(key, served, aliases, "the URL's query")
        optional = value.endswith(OPTIONAL)
        weight = _query_weight(value.removesuffix(OPTIONAL), f"the URL's {key}")
        _add(wanted, key, reward, Wanted(weight, optional), "the URL's query")
    return wanted


def from_metadata(rewards: Any, served: Sequence[str], aliases: Mapping[str, str] = {}) -> dict[str, Wanted]:
    """``metadata["rewards"]``: ``{name: weight}`` or ``{name: {"weight": w, "optional": true}}``."""
    if not isinstance(rewards, dict) or not rewards:
        raise Unprocessable(
            f"metadata['rewards'] = {quote(rewards)} must be a non-empty dict of reward names to weights "
            '(or to {"weight": w, "optional": true})'
        )
    wanted: dict[str, Wanted] = {}
    for name, spec in rewards.items():
        reward = _served(name, served, aliases, "metadata['rewards']")
        where = f"metadata['rewards'][{name!r}]"
        if not isinstance(spec, dict):
            _add(wanted, name, reward, Wanted(_weight(spec, where)), "metadata['rewards']")
            continue
        if set(spec) - {"weight", "optional"} or "weight" not in spec:
            raise Unprocessable(f'{where} = {quote(spec)} must be a weight or {{"weight": w, "optional": true}}')
        optional = spec.get("optional", False)
        if not isinstance(optional, bool):
            raise Unprocessable(f"{where}['optional'] = {quote(optional)} must be true or false")
        _add(
            wanted, name, reward, Wanted(_weight(spec["weight"], f"{where}['weight']"), optional), "metadata['rewards']"
        )
    return wanted


def requested(
    query: Sequence[tuple[str, str]],
    metadata: Mapping[str, Any],
    served: Sequence[str],
    aliases: Mapping[str, str] = {},
) -> dict[str, Wanted]:
    """The rewards a request wants, by served name: the URL's query when it has one (it wins),
    else ``metadata["rewards"]``, else every served reward with weight 1. ``aliases``: other
    names a request may give a served reward (alias -> its name)."""
    if query:
        return from_query(query, served, aliases)
    if "rewards" in metadata:
        return from_metadata(metadata["rewards"], served, aliases)
    return {name: Wanted(1.0) for name in served}
