"""QoE aggregates per tenant, tier and side, in time buckets: what a summary reads.

A summary over a window must not read every record: ``/metrics`` and ``GET
/v1/tokenpace/qoe`` would then cost more with every stream served. Each record instead
adds to the numbers of its (tenant, tier, side) in one bucket of each of :data:`LEVELS`
(10 s buckets kept 2 hours, 5 min kept 2 days, 1 h kept ``telemetry.retention_s``), and
a window is read as the few buckets that cover it (:func:`plan`: the finest at its two
ends, the coarsest in between; at most 84 buckets for a window within the last 2 hours,
and 84 plus one per hour beyond). The cost of a summary depends on the window and on
how many tenants and tiers there are, never on the number of records.

A window starts at a bucket boundary at or before ``now - window``: it holds up to 10 s
more than asked (5 min once its start is over 2 hours old, 1 h over 2 days).

The numbers of a group, ``<tier>|<side>|<name>`` in a tenant's bucket:

========  ===============================================================
n, a, m   records, Σ Andes QoE (Eq. 1), Σ monotone QoE
dn, da    records with a displayed timeline, Σ its Andes QoE
rn        records with what the reader saw (some token reached them)
fz, il    Σ freezes, Σ user idle latency (Wang et al. Eq. 9)
f2 f5 f10 records whose longest freeze is over 2, 5, 10 s (qos.metrics.FREEZE_THRESHOLDS_S)
xf, xi    the longest freeze, the longest idle latency (merged by max)
wn, wa    client records that say when their reader was away, those away at some point
ws        Σ seconds away (of the wn records)
ha<i>     histogram of Andes QoE: bin i < 50 holds [i/50, (i+1)/50), bin 50 exactly 1
hm, hd    the same for monotone QoE and displayed Andes QoE
hf<i>     histogram of the longest freeze: bin ``z`` holds 0 (no freeze), bin i holds
          [2^(i/4), 2^((i+1)/4)) s, the lowest and highest bins open-ended
hi<i>     the same for the idle latency
========  ===============================================================

Percentiles are estimated from the histograms (linear within a bin, never above the
largest value seen): within 0.02 for QoE, within 19 % of the value for seconds. Means,
counts, the shares over 2, 5 and 10 s and the longest freeze are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.store.base import QoEAggregates, QoERecord
from qos.metrics import FREEZE_EPSILON_S, FREEZE_THRESHOLDS_S, ReaderSummary


@dataclass(frozen=True, slots=True)
class Level:
    """Buckets of ``size_s`` seconds, each kept ``keep_s`` (None: the retention)."""

    size_s: int
    keep_s: int | None


LEVELS = (Level(10, 2 * 3600), Level(300, 2 * 86400), Level(3600, None))
QOE_BINS = 50  # bins of 1/50 below 1, and bin 50 for exactly 1
_LOW_BIN, _HIGH_BIN = -28, 60  # seconds: 2^-7 s to 2^15 s in quarter powers of two
_MAX_FIELDS = ("xf", "xi")  # merged by max, every other field is summed
_HISTOGRAMS = {"andes": "ha", "monotone": "hm", "displayed_andes": "hd"}

Sums = dict[str, float]  # "<tier>|<side>|<name>" -> number


def keeps(retention_s: int) -> list[int]:
    """How long each level's buckets are kept after they end."""
    return [lvl.keep_s if lvl.keep_s is not None else retention_s for lvl in LEVELS]


def kept(level: int, start: int, now: float, retention_s: int) -> bool:
    """Whether the bucket of ``level`` starting at ``start`` is still kept at ``now``."""
    return now - start < LEVELS[level].size_s + keeps(retention_s)[level]


def qoe_bin(value: float) -> str:
    return "50" if value >= 1.0 else str(min(int(value * QOE_BINS), QOE_BINS - 1))


def seconds_bin(value: float) -> str:
    if value <= FREEZE_EPSILON_S:
        return "z"
    return str(min(max(math.floor(4 * math.log2(value)), _LOW_BIN), _HIGH_BIN))


def add_record(sums: Sums, maxima: Sums, rec: QoERecord) -> None:
    """Add what ``rec`` contributes to its group's numbers (see the module docstring)."""
    g = f"{rec.tier}|{rec.side}|"

    def add(name: str, value: float = 1.0) -> None:
        sums[g + name] = sums.get(g + name, 0.0) + value

    add("n")
    add("a", rec.andes)
    add("m", rec.monotone)
    add("ha" + qoe_bin(rec.andes))
    add("hm" + qoe_bin(rec.monotone))
    if rec.displayed_andes is not None:
        add("dn")
        add("da", rec.displayed_andes)
        add("hd" + qoe_bin(rec.displayed_andes))
    if rec.longest_freeze_s is not None and rec.idle_s is not None:
        longest, idle = rec.longest_freeze_s, rec.idle_s
        add("rn")
        add("fz", float(rec.freezes or 0))
        add("il", idle)
        add("hf" + seconds_bin(longest))
        add("hi" + seconds_bin(idle))
        for x in FREEZE_THRESHOLDS_S:
            if longest > x:
                add(f"f{x:g}")
        maxima[g + "xf"] = max(maxima.get(g + "xf", 0.0), longest)
        maxima[g + "xi"] = max(maxima.get(g + "xi", 0.0), idle)
    if rec.away_s is not None:  # a report that says when its reader was away
        add("wn")
        add("ws", rec.away_s)
        if rec.away_s > 0:
            add("wa")


def contributions(records: Iterable[QoERecord]) -> dict[str, tuple[Sums, Sums]]:
    """tenant -> (sums, maxima) of ``records`` together."""
    out: dict[str, tuple[Sums, Sums]] = {}
    for rec in records:
        sums, maxima = out.setdefault(rec.tenant, ({}, {}))
        add_record(sums, maxima, rec)
    return out


def bucket_key(level: int, start: int, tenant: str) -> str:
    """The name of a tenant's bucket (``qa:<size>:<start>:<tenant>`` in Redis)."""
    return f"{LEVELS[level].size_s}:{start}:{tenant}"


def plan(now: float, window_s: float, retention_s: int) -> list[tuple[int, int]]:
    """The buckets ``(level, start)`` that cover the window ``[now - window_s, now]``.

    The window's start is aligned down to the finest level that still keeps it; then,
    from there to the end of the current 10 s bucket, each step takes the coarsest bucket
    that starts there, ends by then and is still kept.
    """
    fine = LEVELS[0].size_s
    end = (math.floor(now) // fine + 1) * fine
    since = now - min(window_s, retention_s)
    t = end - fine
    for level, lvl in enumerate(LEVELS):
        t = math.floor(since) // lvl.size_s * lvl.size_s
        if kept(level, t, now, retention_s):
            break
    out: list[tuple[int, int]] = []
    while t < end:
        level = 0
        for i in range(len(LEVELS) - 1, 0, -1):
            size = LEVELS[i].size_s
            if t % size == 0 and t + size <= end and kept(i, t, now, retention_s):
                level = i
                break
        out.append((level, t))
        t += LEVELS[level].size_s
    return out


def merge_into(acc: QoEAggregates, tenant: str, row: Mapping[str, Any]) -> int:
    """Add one bucket's fields to ``acc``; returns how many fields were not numbers of a
    group (skipped: a bad row never spoils a summary)."""
    bad = 0
    for key, raw in row.items():
        tier, _, rest = key.partition("|")
        side, _, name = rest.partition("|")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if not (name and side in ("gateway", "client") and math.isfinite(value) and value >= 0):
            bad += 1
            continue
        group = acc.setdefault((tenant, tier, side), {})
        if name in _MAX_FIELDS:
            group[name] = max(group.get(name, 0.0), value)
        else:
            group[name] = group.get(name, 0.0) + value
    return bad


def combine(groups: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Several groups' numbers as one (a tenant's tiers, for its overall summary)."""
    out: dict[str, float] = {}
    for g in groups:
        for name, value in g.items():
            out[name] = (
                max(out.get(name, 0.0), value)
                if name in _MAX_FIELDS
                else (out.get(name, 0.0) + value)
            )
    return out


def _qoe_edges(i: int) -> tuple[float, float]:
    return (1.0, 1.0) if i >= QOE_BINS else (i / QOE_BINS, (i + 1) / QOE_BINS)


def _seconds_edges(i: int) -> tuple[float, float]:
    return 2.0 ** (i / 4), 2.0 ** ((i + 1) / 4)


Histograms = dict[str, list[tuple[float, float, float]]]  # prefix -> (low, high, count)


def histograms(g: Mapping[str, float]) -> Histograms:
    """Every histogram of a group: its bins (low, high, count) in order, by prefix."""
    out: Histograms = {}
    for name, count in g.items():
        prefix, index = name[:2], name[2:]
        if prefix[0] != "h" or count <= 0:
            continue
        if index == "z":
            out.setdefault(prefix, []).append((0.0, 0.0, count))
            continue
        try:
            i = int(index)
        except ValueError:
            continue
        low, high = _qoe_edges(i) if prefix in ("ha", "hm", "hd") else _seconds_edges(i)
        out.setdefault(prefix, []).append((low, high, count))
    for bins in out.values():
        bins.sort()
    return out


def quantiles(
    bins: Sequence[tuple[float, float, float]], qs: Sequence[float], top: float
) -> list[float]:
    """The ``qs`` quantiles of a histogram, linear within a bin, at most ``top``."""
    total = sum(c for _, _, c in bins)
    out: list[float] = []
    for q in qs:
        target, before, value = q * total, 0.0, top
        for low, high, count in bins:
            if before + count >= target:
                value = low + (high - low) * max(target - before, 0.0) / count
                break
            before += count
        out.append(min(value, top))
    return out


def qoe_stats(
    g: Mapping[str, float], metric: str, hists: Histograms | None = None
) -> dict[str, float] | None:
    """Mean (exact) and p50/p90/p99 (estimated) of a QoE metric of a group, or None;
    ``hists``: the group's :func:`histograms`, when already made."""
    count, total = (
        (g.get("dn", 0.0), g.get("da", 0.0))
        if metric == "displayed_andes"
        else (
            g.get("n", 0.0),
            g.get({"andes": "a", "monotone": "m"}[metric], 0.0),
        )
    )
    if count <= 0:
        return None
    bins = (hists if hists is not None else histograms(g)).get(_HISTOGRAMS[metric], [])
    p50, p90, p99 = quantiles(bins, (0.5, 0.9, 0.99), 1.0)
    return {"mean": min(total / count, 1.0), "p50": p50, "p90": p90, "p99": p99}


def away_summary(g: Mapping[str, float]) -> dict[str, float] | None:
    """Of the replies whose reports said when their reader was away: how many, the share
    that were away at some point, and the mean seconds away; None when none said."""
    replies = g.get("wn", 0.0)
    if replies <= 0:
        return None
    return {
        "replies": replies,
        "away_share": min(g.get("wa", 0.0) / replies, 1.0),
        "mean_away_s": g.get("ws", 0.0) / replies,
    }


def reader_summary(g: Mapping[str, float], hists: Histograms | None = None) -> ReaderSummary | None:
    """What the group's readers saw (:class:`qos.metrics.ReaderSummary`), or None."""
    replies = g.get("rn", 0.0)
    if replies <= 0:
        return None
    hists = hists if hists is not None else histograms(g)
    longest, idle_top = g.get("xf", 0.0), g.get("xi", 0.0)
    froze = [b for b in hists.get("hf", []) if b[1] > 0]
    (median,) = quantiles(froze, (0.5,), longest) if froze else (None,)
    idle50, idle99 = quantiles(hists.get("hi", []), (0.5, 0.99), idle_top)
    return ReaderSummary(
        replies=int(replies),
        frozen_share={x: min(g.get(f"f{x:g}", 0.0) / replies, 1.0) for x in FREEZE_THRESHOLDS_S},
        longest_freeze_s=longest,
        median_freeze_s=median,
        idle_p50_s=idle50,
        idle_p99_s=idle99,
    )
