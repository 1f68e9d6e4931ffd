"""What a price plan is worth in the simulator, and the plans' targets at one rate.

A plan of weight w_f is sold as w_f / Σw of the engine. Its **share** reference is what
the tenant's own requests get from that part of the engine: their demand scaled by
Σw / w_f on the whole engine (:func:`qos.sim.scale_demand`), which is the load they put
on w_f / Σw of its KV cache, batch slots and compute together, as on that part of a
fleet of such engines. Its **alone** reference is what they get with the whole engine to
themselves. A tenant *fits* its share when the share serves it at QoE ≥ ISOLATION_QOE
with no reply frozen over 2 s.

(A share of the cache and the slots alone, at the whole engine's speed, is no share of
the engine: a smaller batch runs each sequence faster, and on OPT-66B the three slices of
a 1 : 2 : 4 split streamed 1,328 tokens/s together where the whole engine streams 863.)

The targets (docs/architecture/policy.md, "Price plans"; measured in docs/benchmarks.md), for
the shipped policy against the same policy with weights ignored, in the same run:

1. nobody loses when nobody has to: where the unweighted policy serves every tenant at
   QoE ≥ SERVED_WELL_QOE with no frozen reply, no tenant's QoE moves by more than
   NOBODY_LOSES_MAX;
2. elsewhere the shortfall lands on the cheaper plans first: QoE ordered by weight, the
   total at least TOTAL_MIN of the unweighted policy's, and the highest weight, where it
   fits its share, within NOBODY_LOSES_MAX of its QoE alone;
3. isolation: every tenant that fits its share keeps QoE ≥ ISOLATION_QOE, no reply frozen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from qos.sim import SimRequest, SimResult, scale_demand

SERVED_WELL_QOE = 0.9
NOBODY_LOSES_MAX = 0.02
TOTAL_MIN = 0.97
ISOLATION_QOE = 0.95
ORDER_TOLERANCE = 0.005  # QoE ordered by weight: a lower weight at most this far ahead


def plan_references(
    workload: Sequence[SimRequest],
    weights: dict[str, float],
    simulate_one: Callable[[list[SimRequest]], SimResult],
) -> dict[str, dict[str, float]]:
    """Per tenant of ``workload``: its share reference (average QoE, share of replies
    frozen over 2 s, user idle latency p99) and its QoE alone (module doc), each run by
    ``simulate_one`` (the benchmark's policy, engine and options)."""
    total = sum(weights.values())
    out = {}
    for name, weight in weights.items():
        mine = [r for r in workload if r.tenant == name]
        if not mine:
            continue
        share = simulate_one(scale_demand(mine, total / weight))
        seen = share.reader()
        out[name] = {
            "share_avg_qoe": share.avg_qoe,
            "share_frozen_over_2s": seen.frozen_share[2.0],
            "share_idle_p99_s": seen.idle_p99_s,
            "alone_avg_qoe": simulate_one(mine).avg_qoe,
        }
    return out


def fits_share(tenant: dict[str, Any]) -> bool | None:
    """Whether a tenant's share serves it at QoE ≥ ISOLATION_QOE with no frozen reply
    (None without the reference)."""
    if tenant.get("share_avg_qoe") is None:
        return None
    return bool(tenant["share_avg_qoe"] >= ISOLATION_QOE and tenant["share_frozen_over_2s"] == 0)


def verdicts(tenants: dict[str, dict[str, Any]], total_ratio: float | None) -> dict[str, Any]:
    """The targets at one rate (module doc). ``tenants``: per name its weight, QoE and
    share of replies frozen over 2 s with plans, ``unweighted_avg_qoe`` and
    ``unweighted_frozen_over_2s`` (None without the unweighted run) and the references;
    ``total_ratio``: average QoE with plans over the unweighted policy's."""
    names = sorted(tenants, key=lambda k: tenants[k]["weight"])
    qoe = [tenants[k]["avg_qoe"] for k in names]
    out: dict[str, Any] = {
        "ordered_by_weight": all(a <= b + ORDER_TOLERANCE for a, b in pairwise(qoe))
    }
    blind = [tenants[k].get("unweighted_avg_qoe") for k in names]
    if None not in blind and total_ratio is not None:
        out["total_vs_unweighted"] = total_ratio
        well = all(
            t["unweighted_avg_qoe"] >= SERVED_WELL_QOE and t["unweighted_frozen_over_2s"] == 0
            for t in tenants.values()
        )
        out["served_well_unweighted"] = well
        changes = {k: tenants[k]["avg_qoe"] - tenants[k]["unweighted_avg_qoe"] for k in names}
        out["largest_loss"] = max(0.0, -min(changes.values()))
        out["largest_change"] = max(abs(v) for v in changes.values())
    fitting = [k for k in names if fits_share(tenants[k])]
    out["fit_share"] = fitting
    out["isolation_misses"] = [
        k
        for k in fitting
        if tenants[k]["avg_qoe"] < ISOLATION_QOE or tenants[k]["frozen_over_2s"] > 0
    ]
    top = names[-1]
    if top in fitting and tenants[top].get("alone_avg_qoe") is not None:
        out["top_below_alone"] = tenants[top]["alone_avg_qoe"] - tenants[top]["avg_qoe"]
    return out
