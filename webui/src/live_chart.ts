/**
 * A uPlot chart of values sampled over time (the dashboard's): one series per name,
 * series added as new names appear (a new tenant, a new tier), the oldest samples
 * dropped past `keep`.
 */
import uPlot from "uplot";

const PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"];

export interface LiveChartOptions {
  title: string;
  unit: string;
  keep: number;
  range?: [number, number];
}

export class LiveChart {
  private chart: uPlot | null = null;
  private times: number[] = [];
  private readonly values = new Map<string, Array<number | null>>();

  constructor(
    private readonly target: HTMLElement,
    private readonly options: LiveChartOptions,
  ) {
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
  }

  private size(): { width: number; height: number } {
    return { width: Math.max(320, this.target.clientWidth || 600), height: 220 };
  }

  private data(): uPlot.AlignedData {
    return [this.times, ...this.values.values()];
  }

  private rebuild(): void {
    this.chart?.destroy();
    const names = [...this.values.keys()];
    const range = this.options.range;
    this.chart = new uPlot(
      {
        ...this.size(),
        title: this.options.title,
        scales: range ? { y: { range: () => range } } : {},
        axes: [{}, { label: this.options.unit }],
        series: [
          {},
          ...names.map((label, i) => ({
            label,
            stroke: PALETTE[i % PALETTE.length]!,
            width: 2,
            spanGaps: true,
          })),
        ],
      },
      this.data(),
      this.target,
    );
  }
}
