import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export interface ChartSeries {
  label: string;
  values: number[];
}

/** Distinguishable in light and dark themes, and for the common colour-vision deficiencies (Okabe–Ito). */
const COLORS = ['#0072B2', '#E69F00', '#009E73', '#CC79A7', '#56B4E9', '#D55E00', '#6B6B6B', '#F0E442'];

export function seriesColor(i: number): string {
  return COLORS[i % COLORS.length] ?? '#0072B2';
}

const HEIGHT = 260;

/**
 * A line chart over days (uPlot on a canvas). The canvas says nothing to a screen reader, so the
 * figure carries a summary and every page that draws one also shows the numbers as a table.
 * `data-points` and `data-total` expose what is drawn (for tests and for anyone inspecting it).
 */
export function DayChart(props: {
  days: readonly string[];
  series: readonly ChartSeries[];
  unit: string;
  format: (n: number) => string;
  testid?: string;
}) {
  const { days, series, unit, format } = props;
  const host = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const el = host.current;
    if (!el) return undefined;
    const color = getComputedStyle(el).color || '#222';
    const grid = { stroke: 'rgba(128,128,128,0.25)', width: 1 };
    const xs = days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
    const data: uPlot.AlignedData = [xs, ...series.map((s) => s.values)];
    const opts: uPlot.Options = {
      width: Math.max(280, el.clientWidth),
      height: HEIGHT,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC'),
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      series: [
        { label: 'Day (UTC)', value: (_u, v) => (v === null ? '–' : new Date(v * 1000).toISOString().slice(0, 10)) },
        ...series.map((s, i) => ({
          label: s.label,
          stroke: seriesColor(i),
          width: 2,
          value: (_u: uPlot, v: number | null) => (v === null ? '–' : format(v)),
          points: { show: days.length <= 45 },
          ...(series.length === 1 && { fill: `${seriesColor(i)}22` }),
        })),
      ],
      axes: [
        { stroke: color, grid, ticks: grid },
        { stroke: color, grid, ticks: grid, size: 70, values: (_u, vals) => vals.map((v) => format(v)) },
      ],
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
    };
    const plot = new uPlot(opts, data, el);
    const resize = new ResizeObserver(() => plot.setSize({ width: Math.max(280, el.clientWidth), height: HEIGHT }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      plot.destroy();
    };
  }, [days, series, format]);

  const total = series.reduce((sum, s) => sum + s.values.reduce((a, b) => a + b, 0), 0);
  const summary =
    `${unit} per day from ${days[0] ?? '–'} to ${days[days.length - 1] ?? '–'}: ` +
    (series.length ? series.map((s) => `${s.label} ${format(s.values.reduce((a, b) => a + b, 0))}`).join(', ') : 'no data');
  return (
    <figure class="chart">
      <div
        ref={host}
        class="chart-canvas"
        role="img"
        aria-label={summary}
        data-testid={props.testid}
        data-points={String(days.length * series.length)}
        data-total={String(total)}
      />
      <figcaption class="sr-only">{summary}</figcaption>
    </figure>
  );
}
