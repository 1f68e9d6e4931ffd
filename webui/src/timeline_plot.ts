/**
 * The demo's live plot of one reply's delivery timeline: tokens arrived from the
 * network, tokens displayed by the pacing buffer, and the tier's expected line
 * (the first token at TTFT, then one every 1/TDS s: the expected timeline of Andes
 * (Liu et al.) §3.1). The freezes of the displayed curve (the SDK's `freezeSpans`: where
 * the reader waited for the next token beyond its pace) are shaded. Times are seconds
 * since the request was sent.
 */
import uPlot from "uplot";
import { freezeSpans } from "../../sdk_web/src/index.js";

export type Point = [seconds: number, tokens: number];

export interface Expected {
  ttft: number;
  tds: number;
}

/** Cumulative token count of `points` at each of the sorted times `xs` (a step function). */
export function cumulative(points: readonly Point[], xs: readonly number[]): number[] {
  const sorted = [...points].sort((a, b) => a[0] - b[0]);
  const out: number[] = [];
  let i = 0;
  let total = 0;
  for (const x of xs) {
    while (i < sorted.length && sorted[i]![0] <= x) total += sorted[i++]![1];
    out.push(total);
  }
  return out;
}

/** Tokens the tier expects by time `t`: none before TTFT, then 1 + (t − TTFT)·TDS. */
export function expectedTokens(t: number, expected: Expected): number | null {
  return t < expected.ttft ? null : 1 + (t - expected.ttft) * expected.tds;
}

/** How a freeze is shaded. */
const FREEZE_FILL = "rgba(229, 57, 53, 0.18)";

/** The plot of one reply; the target's `.placeholder` shows until a reply is under way. */
export class TimelinePlot {
  private readonly chart: uPlot;
  private readonly placeholder: HTMLElement | null;
  private arrived: Point[] = [];
  private shown: Point[] = [];
  private expected: Expected | null = null;
  private freezes: Array<[from: number, to: number]> = [];
  private pending = false;

  constructor(private readonly target: HTMLElement) {
    this.placeholder = target.querySelector<HTMLElement>(".placeholder");
    const stepped = uPlot.paths.stepped?.({ align: 1 });
    this.chart = new uPlot(
      {
        width: Math.max(320, target.clientWidth || 640),
        height: 260,
        scales: { x: { time: false } },
        axes: [{ label: "seconds since the request" }, { label: "tokens" }],
        series: [
          { label: "s" },
          { label: "arrived", stroke: "#8a8f98", width: 2, points: { show: false }, ...(stepped ? { paths: stepped } : {}) },
          { label: "displayed", stroke: "#1565c0", width: 2, points: { show: false }, ...(stepped ? { paths: stepped } : {}) },
          { label: "expected", stroke: "#2e7d32", width: 1, dash: [6, 4], spanGaps: true, points: { show: false } },
        ],
        legend: { live: false },
        hooks: { drawClear: [(u) => this.shadeFreezes(u)] },
      },
      [[], [], [], []],
      target,
    );
    new ResizeObserver(() => {
      this.chart.setSize({ width: Math.max(320, target.clientWidth), height: 260 });
    }).observe(target);
  }

  reset(expected: Expected | null): void {
    this.arrived = [];
    this.shown = [];
    this.expected = expected;
    this.draw();
  }

  setExpected(expected: Expected): void {
    this.expected = expected;
    this.schedule();
  }

  /** Replace both timelines (the SDK's, once the reply is over). */
  setTimelines(arrived: readonly Point[], shown: readonly Point[]): void {
    this.arrived = [...arrived];
    this.shown = [...shown];
    this.schedule();
  }

  addArrived(point: Point): void {
    this.arrived.push(point);
    this.schedule();
  }

  addShown(point: Point): void {
    this.shown.push(point);
    this.schedule();
  }

  private schedule(): void {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  /** Behind the curves: a band over each freeze of the displayed curve. */
  private shadeFreezes(u: uPlot): void {
    const { ctx, bbox } = u;
    ctx.save();
    ctx.fillStyle = FREEZE_FILL;
    for (const [from, to] of this.freezes) {
      const left = u.valToPos(from, "x", true);
      const right = u.valToPos(to, "x", true);
      ctx.fillRect(left, bbox.top, right - left, bbox.height);
    }
    ctx.restore();
  }

  private draw(): void {
    const expected = this.expected;
    this.freezes = expected && this.shown.length > 0 ? freezeSpans(this.shown, expected.tds) : [];
    this.target.dataset["freezes"] = String(this.freezes.length);
    const times = new Set<number>([0]);
    for (const [t] of this.arrived) times.add(t);
    for (const [t] of this.shown) times.add(t);
    if (expected) times.add(expected.ttft);
    const xs = [...times].sort((a, b) => a - b);
    const line = xs.map((x) => (expected ? expectedTokens(x, expected) : null));
    this.chart.setData([xs, cumulative(this.arrived, xs), cumulative(this.shown, xs), line]);
    if (this.placeholder) this.placeholder.hidden = expected !== null || this.arrived.length + this.shown.length > 0;
  }
}
