/**
 * The dashboard's QoE chart before its first live sample, from what the gateway offers:
 * `GET /v1/tokenpace/qoe?window=W` summarises the records of the W seconds that end now
 * (per tenant, tier and side: a count and a mean). Windows nested in steps of `step`
 * seconds give the count and the sum (count × mean) of each step's records, and from
 * those, the mean over `window` seconds as it stood `step`, 2·`step`, ... seconds ago:
 * the quantity the live chart plots at each poll.
 */

/** One side of a tier's summary, as the gateway sends it. */
export interface SideSummary {
  count: number;
  andes?: { mean: number };
}

export interface QoESummary {
  window_s: number;
  tenants: Record<string, { tiers: Record<string, { gateway: SideSummary; client: SideSummary }> }>;
}

export type Side = "gateway" | "client";

/** Series name → [records, sum of their Andes QoE], for one side. */
type Totals = Map<string, [count: number, sum: number]>;

/** The windows to ask for: step, 2·step, ... up to `window` + `history` seconds. */
export function historyWindows(window: number, history: number, step: number): number[] {
  return Array.from({ length: Math.ceil((window + history) / step) }, (_, i) => (i + 1) * step);
}

/** Each side's totals of a summary, by series name (`tenant/tier`). */
export function totals(summary: QoESummary): Record<Side, Totals> {
  const out: Record<Side, Totals> = { gateway: new Map(), client: new Map() };
  for (const [tenant, { tiers }] of Object.entries(summary.tenants)) {
    for (const [tier, sides] of Object.entries(tiers)) {
      for (const side of ["gateway", "client"] as const) {
        const { count, andes } = sides[side];
        if (count > 0 && andes) out[side].set(`${tenant}/${tier}`, [count, count * andes.mean]);
      }
    }
  }
  return out;
}

/**
 * The mean Andes QoE over `window` seconds as it stood `ago` seconds before now, for
 * `ago` = `history`, ... , 2·`step`, `step` (oldest first), from the totals of the
 * windows `historyWindows(window, history, step)` (`byWindow[w]`: the last w seconds).
 */
export function history(
  byWindow: ReadonlyMap<number, Totals>,
  window: number,
  history: number,
  step: number,
): Array<{ ago: number; sample: Record<string, number | null> }> {
  const names = new Set<string>();
  for (const t of byWindow.values()) for (const name of t.keys()) names.add(name);
  const at = (w: number, name: string): [number, number] => (w === 0 ? [0, 0] : (byWindow.get(w)?.get(name) ?? [0, 0]));
  const out: Array<{ ago: number; sample: Record<string, number | null> }> = [];
  for (let ago = Math.floor(history / step) * step; ago >= step; ago -= step) {
    const sample: Record<string, number | null> = {};
    for (const name of names) {
      const [newerCount, newerSum] = at(ago, name);
      const [olderCount, olderSum] = at(ago + window, name);
      const count = olderCount - newerCount;
      // a record that arrived between two of the queries can make a difference negative
      sample[name] = count > 0 ? Math.min(1, Math.max(0, (olderSum - newerSum) / count)) : null;
    }
    out.push({ ago, sample });
  }
  return out;
}
