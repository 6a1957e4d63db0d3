import type { Limits, Pricing } from './api.js';

const numberFormat = new Intl.NumberFormat('en-US');

export function formatNumber(n: number): string {
  return numberFormat.format(n);
}

/** US dollars: small amounts keep their significant digits (a few tokens cost a fraction of a cent). */
export function formatCost(n: number | null | undefined): string {
  if (n === null || n === undefined) return '–';
  if (n === 0) return '$0';
  if (Math.abs(n) < 0.01) return `$${n.toPrecision(2)}`;
  return `$${n.toFixed(n < 100 ? 4 : 2)}`;
}

export function formatBytes(n: number): string {
  if (n >= 1024 ** 3) return `${(n / 1024 ** 3).toFixed(2)} GiB`;
  if (n >= 1024 ** 2) return `${(n / 1024 ** 2).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${Math.round(n)} B`;
}

/** Unix seconds as local date and time. */
export function formatTime(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return '–';
  return new Date(seconds * 1000).toLocaleString('en-GB', { dateStyle: 'medium', timeStyle: 'short' });
}

const PRICE_UNITS: Record<string, string> = {
  input_tokens: 'in /1M tok',
  output_tokens: 'out /1M tok',
  cached_input_tokens: 'cached /1M tok',
  input_characters: 'in /1M chars',
  megapixels: '/MP',
  audio_seconds: '/audio s',
};

export function formatPricing(pricing: readonly Pricing[]): string {
  if (pricing.length === 0) return 'not priced';
  return pricing.map((p) => `$${p.rate} ${PRICE_UNITS[p.metric] ?? p.metric}`).join(', ');
}

export function formatLimits(l: Limits | null): string {
  if (!l) return 'none';
  const parts: string[] = [];
  if (l.rpm !== undefined) parts.push(`${l.rpm} req/min`);
  if (l.tpm !== undefined) parts.push(`${formatNumber(l.tpm)} tok/min`);
  if (l.budget !== undefined) parts.push(`$${l.budget}/${l.budget_period ?? 'month'}`);
  if (l.models !== undefined) parts.push(`models: ${l.models.join(', ') || 'none'}`);
  return parts.length ? parts.join(' · ') : 'none';
}

/** YYYY-MM-DD of a date in UTC (the usage ledger's days are UTC). */
export function isoDay(d: Date): string {
  return d.toISOString().slice(0, 10);
}

export function addDays(day: string, n: number): string {
  const d = new Date(`${day}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + n);
  return isoDay(d);
}

/** Every day from `from` to `to`, both included (at most a few years). */
export function daysBetween(from: string, to: string): string[] {
  const out: string[] = [];
  for (let d = from; d <= to && out.length < 3700; d = addDays(d, 1)) out.push(d);
  return out;
}

function csvCell(v: unknown): string {
  const s = v === null || v === undefined ? '' : String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function toCsv(header: readonly string[], rows: ReadonlyArray<ReadonlyArray<unknown>>): string {
  return [header, ...rows].map((r) => r.map(csvCell).join(',')).join('\r\n') + '\r\n';
}

/** Offers text as a file download (a blob URL: nothing leaves the browser). */
export function download(name: string, text: string, type = 'text/csv;charset=utf-8'): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}

export function parseJson(text: string): { value: unknown } | { error: string } {
  try {
    return { value: JSON.parse(text) as unknown };
  } catch (err) {
    return { error: err instanceof Error ? err.message : String(err) };
  }
}
