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


def fixed(value: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, never '-0.00': a value that rounds to zero is zero, whichever its sign."""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text


def format_kappa(kappa: float, stderr: float) -> str:
    """'-0.02 ± 0.09' ('0.00 ± 0.06' for a kappa of -0.001)."""
    return f"{fixed(kappa)} ± {fixed(stderr)}"


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


# --------------------------------------------------------------------------------------------
# Tests for experiments (arms x seeds): exact where the counts are small, as a skeptic asks


def sign_test_p(gained: int, lost: int) -> float:
    """Exact two-sided sign test (McNemar's exact test) on the discordant pairs of a paired 0/1 comparison:
    under no effect each of the ``gained + lost`` episodes that flipped did so up or down with probability 1/2, so
    p = min(1, 2 P(X <= min(gained, lost))), X ~ Binomial(gained + lost, 1/2); 1 when no episode flipped."""
    if gained < 0 or lost < 0:
        raise ValueError(f"a sign test counts flips, got gained={gained}, lost={lost}")
    flips = gained + lost
    tail = sum(math.comb(flips, k) for k in range(min(gained, lost) + 1)) / 2**flips
    return min(1.0, 2.0 * tail)


def normal_p(z: float) -> float:
    """Two-sided p of a standard-normal statistic: P(|Z| >= |z|)."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def paired_test(before: Sequence[bool], after: Sequence[bool]) -> dict[str, float | int | None]:
    """:func:`paired_difference` with its two tests side by side: ``z`` = difference / paired SE and its normal ``p_normal``
    (None when no episode flipped, or every one did), and the exact sign test on the flips, ``p_exact`` (:func:`sign_test_p`)."""
    change = paired_difference(before, after)
    z = change["difference"] / change["stderr"] if change["stderr"] > 0 else None
    return change | {"z": z, "p_normal": None if z is None else normal_p(z), "p_exact": sign_test_p(change["gained"], change["lost"])}


def mean_with_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean of ``values`` (e.g. one change per seed) and its standard error sqrt(s^2 / n), s^2 the sample variance; None for n < 2."""
    n = len(values)
    if n == 0:
        raise ValueError("a mean needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


_TIE = 1e-12  # statistics equal up to rounding count as at least as extreme


def sign_flip_p(values: Sequence[float]) -> float:
    """Exact two-sided permutation test that ``values`` (one per seed) are centred on 0: under no effect each value's
    sign is as likely flipped, so p is the share of the 2^n sign assignments whose |sum| is at least the observed one.
    Its smallest p is 2 / 2^n: 0.25 with 3 seeds, 0.0625 with 5, 0.031 with 6."""
    n = len(values)
    if n == 0:
        raise ValueError("a sign-flip test needs at least one value")
    observed = abs(sum(values))
    extreme = sum(abs(sum(v if (mask >> i) & 1 else -v for i, v in enumerate(values))) >= observed - _TIE for mask in range(2**n))
    return extreme / 2**n


def permutation_p(first: Sequence[float], second: Sequence[float]) -> float:
    """Exact two-sided permutation test that two groups of values (e.g. two arms' changes, one per seed) share one
    distribution: the share of the C(n + m, n) ways to split the pooled values into groups of n and m whose difference of
    means is, in absolute value, at least the observed one. Its smallest p is 2 / C(2n, n) with n seeds per arm: 0.1 with 3,
    0.0079 with 5."""
    import itertools

    n, m = len(first), len(second)
    if n == 0 or m == 0:
        raise ValueError(f"a permutation test needs values in both groups, got {n} and {m}")
    pooled, total = [*first, *second], sum(first) + sum(second)
    observed = abs(sum(first) / n - sum(second) / m)
    splits = extreme = 0
    for chosen in itertools.combinations(range(n + m), n):
        inside = sum(pooled[i] for i in chosen)
        splits += 1
        extreme += abs(inside / n - (total - inside) / m) >= observed - _TIE
    return extreme / splits


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (e.g. one per task), in their order: the i-th smallest of m
    becomes max over j <= i of min(1, (m - j + 1) p_(j)); a family-wise error rate of alpha holds for those below alpha.
    None (a test that could not be made) stays None and does not count in m."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted
