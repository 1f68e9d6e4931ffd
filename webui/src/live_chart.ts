/**
 * A uPlot chart of values sampled over time (the dashboard's): one series per name,
 * series added as new names appear (a new tenant, a new tier), the oldest samples
 * dropped past `keep`. While the cursor is off the chart, the legend shows each series'
 * latest value. Charts that share a `SeriesColors` draw the same name in the same colour.
 */
import uPlot from "uplot";

const PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"];

/** A colour per series name, the same in every chart that shares it. */
export class SeriesColors {
  private readonly assigned = new Map<string, string>();

  of(name: string): string {
    let color = this.assigned.get(name);
    if (color === undefined) {
      color = PALETTE[this.assigned.size % PALETTE.length]!;
      this.assigned.set(name, color);
    }
    return color;
  }
}

export interface LiveChartOptions {
  title: string;
  unit: string;
  keep: number;
  /** A fixed y range (QoE: [0, 1]); else from zero to above the largest value. */
  range?: [number, number];
  colors?: SeriesColors;
}

export class LiveChart {
  private chart: uPlot | null = null;
  private times: number[] = [];
  private readonly values = new Map<string, Array<number | null>>();
  private readonly colors: SeriesColors;

  constructor(
    private readonly target: HTMLElement,
    private readonly options: LiveChartOptions,
  ) {
    this.colors = options.colors ?? new SeriesColors();
    new ResizeObserver(() => this.chart?.setSize(this.size())).observe(target);
  }

  /** One sample at `time` (unix seconds); a name absent here has no value at that time. */
  push(time: number, sample: Record<string, number | null>): void {
    const fresh = Object.keys(sample).filter((name) => !this.values.has(name));
    for (const name of fresh) this.values.set(name, this.times.map(() => null));
    this.times.push(time);
    for (const [name, column] of this.values) column.push(sample[name] ?? null);
    if (this.times.length > this.options.keep) {
      this.times.shift();
      for (const column of this.values.values()) column.shift();
    }
    if (fresh.length > 0 || this.chart === null) this.rebuild();
    else this.chart.setData(this.data());
    if (!this.hovered()) this.showLatest();
    this.describe();
  }

  /** What is drawn, on the target's data attributes (for the page's tests). */
  private describe(): void {
    const values = [...this.values.values()].reduce((n, column) => n + column.filter((v) => v !== null).length, 0);
    this.target.dataset["samples"] = String(this.times.length);
    this.target.dataset["values"] = String(values);
    this.target.dataset["yMin"] = String(this.chart?.scales["y"]?.min ?? "");
  }

  private size(): { width: number; height: number } {
    return { width: Math.max(320, this.target.clientWidth || 600), height: 220 };
  }

  private data(): uPlot.AlignedData {
    return [this.times, ...this.values.values()];
  }

  private hovered(): boolean {
    const left = this.chart?.cursor.left;
    return left !== undefined && left >= 0;
  }

  /** The legend at each series' last value (not "--" when the cursor is elsewhere). */
  private showLatest(): void {
    if (this.chart === null || this.times.length === 0) return;
    const last = (column: ReadonlyArray<number | null>): number | null => {
      for (let i = column.length - 1; i >= 0; i--) if (column[i] !== null) return i;
      return null;
    };
    this.chart.setLegend({ idxs: [this.times.length - 1, ...[...this.values.values()].map(last)] }, false);
  }

  private rebuild(): void {
    this.chart?.destroy();
    const names = [...this.values.keys()];
    const range = this.options.range;
    this.chart = new uPlot(
      {
        ...this.size(),
        title: this.options.title,
        scales: {
          y: { range: range ? () => range : (_u, _min, max) => uPlot.rangeNum(0, max > 0 ? max : 1, 0.1, true) },
        },
        axes: [{}, { label: this.options.unit }],
        series: [
          {},
          ...names.map((label) => ({ label, stroke: this.colors.of(label), width: 2, spanGaps: true })),
        ],
        hooks: {
          // the cursor left the chart: back to the latest values
          setCursor: [(u) => u.cursor.left !== undefined && u.cursor.left < 0 && this.showLatest()],
        },
      },
      this.data(),
      this.target,
    );
  }
}
