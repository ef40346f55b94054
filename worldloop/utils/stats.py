"""Small statistics that every report needs."""

from __future__ import annotations

import math
from typing import Any, Sequence


def rate_with_stderr(outcomes: Sequence[bool] | Sequence[float]) -> tuple[float, float]:
    """Mean of 0/1 outcomes and its binomial standard error sqrt(p (1 - p) / n)."""
    n = len(outcomes)
    if n == 0:
        return float("nan"), float("nan")
    p = float(sum(float(o) for o in outcomes)) / n
    return p, math.sqrt(p * (1.0 - p) / n)


def format_rate(outcomes: Sequence[bool] | Sequence[float]) -> str:
    """'0.820 ± 0.054 (n=50)'."""
    p, se = rate_with_stderr(outcomes)
    return f"{p:.3f} ± {se:.3f} (n={len(outcomes)})"


def paired_difference(before: Sequence[bool], after: Sequence[bool]) -> dict[str, float | int]:
    """How much a 0/1 outcome changed on the same episodes (the same initial states before and after).

    ``difference`` is the mean of after - before, ``stderr`` its standard error over episodes, sqrt(s^2 / n)
    with s^2 the sample variance of the per-episode differences: only episodes whose outcome flipped add
    to it, so it is tighter than the unpaired sqrt(se_before^2 + se_after^2) when most episodes keep theirs.
    ``gained`` and ``lost`` count the flips each way."""
    n = len(before)
    if n < 2 or len(after) != n:
        raise ValueError(f"a paired difference needs two outcomes for each of at least 2 episodes, got {len(before)} and {len(after)}")
    changes = [int(bool(b)) - int(bool(a)) for a, b in zip(before, after)]
    mean = sum(changes) / n
    variance = sum((c - mean) ** 2 for c in changes) / (n - 1)
    return {"difference": mean, "stderr": math.sqrt(variance / n), "gained": changes.count(1), "lost": changes.count(-1), "episodes": n}


def format_paired(change: dict[str, float | int]) -> str:
    """'+0.138 (paired SE 0.043, +3.2 SE; 12 gained, 1 lost)'."""
    difference, stderr = change["difference"], change["stderr"]
    if not change["gained"] and not change["lost"]:
        return f"{difference:+.3f} (no episode changed)"
    z = f"{difference / stderr:+.1f} SE" if stderr > 0 else "every episode changed"
    return f"{difference:+.3f} (paired SE {stderr:.3f}, {z}; {change['gained']} gained, {change['lost']} lost)"


def format_kappa(kappa: float, stderr: float) -> str:
    """'-0.02 ± 0.09'."""
    return f"{kappa:.2f} ± {stderr:.2f}"


def kappa_above_chance(kappa: float | None, stderr: float | None, significance_se: float) -> bool:
    """Whether a kappa lies above 0 (chance) by more than ``significance_se`` of its standard errors (and above 0 at all)."""
    return kappa is not None and kappa > 0 and kappa > significance_se * stderr


def agreement_beyond_chance(first: Sequence[bool], second: Sequence[bool], strata: Sequence[Any]) -> dict[str, float | None]:
    """How often two 0/1 verdicts on the same episodes agree, and how much of it chance explains.

    ``chance`` is the agreement of two independent verdicts with the same success rates within each
    stratum (e.g. each task), weighted by its episodes: a verdict that knows only each task's rate
    reaches it. ``kappa`` = (agreement - chance) / (1 - chance), Cohen's kappa with chance taken within
    strata (one stratum: Cohen's own): 0 at chance, 1 when every episode agrees, None when chance is 1
    (both verdicts constant and equal). ``kappa_stderr`` is Cohen's large-sample sqrt(a (1 - a) / n) / (1 - chance)."""
    first, second = [bool(v) for v in first], [bool(v) for v in second]
    n = len(first)
    if n == 0 or len(second) != n or len(strata) != n:
        raise ValueError(f"agreement needs two verdicts and a stratum for every episode, got {len(first)}, {len(second)} and {len(strata)}")
    agreement = sum(a == b for a, b in zip(first, second)) / n
    chance = 0.0
    for stratum in dict.fromkeys(strata):
        mine = [i for i, s in enumerate(strata) if s == stratum]
        p = sum(first[i] for i in mine) / len(mine)
        q = sum(second[i] for i in mine) / len(mine)
        chance += len(mine) / n * (p * q + (1 - p) * (1 - q))
    if chance >= 1.0 - 1e-12:
        return {"agreement": agreement, "chance": chance, "kappa": None, "kappa_stderr": None}
    kappa = (agreement - chance) / (1.0 - chance)
    kappa_stderr = math.sqrt(agreement * (1.0 - agreement) / n) / (1.0 - chance)
    return {"agreement": agreement, "chance": chance, "kappa": kappa, "kappa_stderr": kappa_stderr}
