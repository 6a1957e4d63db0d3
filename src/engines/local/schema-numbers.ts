/**
 * Numeric ranges as GBNF. Integers in a range are matched exactly (the classic split of a decimal
 * range into digit patterns); numbers with fractions in a range are matched as a subset (whole
 * integer parts inside the range, each with any fraction). Every value these rules accept lies in
 * the range, which is what the grammar guarantee needs; where a range leaves no such value (the
 * caller checks `undefined`), the schema's own check has to do.
 */

/** Integers are written with at most this many digits (as the base `integer` rule): every one is a safe integer. */
const MAX_DIGITS = 15;
const LIMIT = 10 ** MAX_DIGITS - 1;
/** Whole parts written before a fraction (see `numberRange`). */
const FRACTION_LIMIT = 999_999_999;

const digitClass = (lo: number, hi: number): string => (lo === hi ? `"${lo}"` : lo === 0 && hi === 9 ? '[0-9]' : `[${lo}-${hi}]`);
const anyDigits = (n: number): string => (n === 0 ? '' : n === 1 ? '[0-9]' : `[0-9]{${n}}`);

/** Alternatives matching the decimal strings of every integer in [lo, hi], both with the same number of digits. */
function sameLength(lo: string, hi: string): string[] {
  if (lo.length === 1) return [digitClass(Number(lo), Number(hi))];
  const a = Number(lo[0]);
  const b = Number(hi[0]);
  const restLo = lo.slice(1);
  const restHi = hi.slice(1);
  const tail = (rest: string[]): string => (rest.length === 1 ? rest[0]! : `( ${rest.join(' | ')} )`);
  if (a === b) return [`"${a}" ${tail(sameLength(restLo, restHi))}`];
  const zeros = '0'.repeat(restLo.length);
  const nines = '9'.repeat(restLo.length);
  if (restLo === zeros && restHi === nines) return [`${digitClass(a, b)} ${anyDigits(restLo.length)}`];
  const out: string[] = [];
  let from = a;
  let to = b;
  if (restLo !== zeros) {
    out.push(`"${a}" ${tail(sameLength(restLo, nines))}`);
    from = a + 1;
  }
  if (restHi !== nines) to = b - 1;
  if (from <= to) out.push(`${digitClass(from, to)} ${anyDigits(restLo.length)}`);
  if (restHi !== nines) out.push(`"${b}" ${tail(sameLength(zeros, restHi))}`);
  return out;
}

/** Alternatives for the non-negative integers in [lo, hi] (hi may be Infinity), without leading zeros. */
function nonNegative(lo: number, hi: number): string[] {
  const out: string[] = [];
  const top = Math.min(hi, LIMIT);
  let start = lo;
  while (start <= top) {
    const digits = String(start).length;
    const end = Math.min(top, 10 ** digits - 1);
    if (hi === Infinity && end === 10 ** digits - 1 && digits < MAX_DIGITS) {
      // Open above: every longer number, in one alternative.
      out.push(...sameLength(String(start), String(end)));
      out.push(`[1-9] [0-9]{${digits},${MAX_DIGITS - 1}}`);
      return out;
    }
    out.push(...sameLength(String(start), String(end)));
    start = end + 1;
  }
  return out;
}

/**
 * An expression matching exactly the integers in [lo, hi] (either may be infinite), written as JSON
 * writes them; `undefined` when there are none.
 */
export function integerRange(lo: number, hi: number): string | undefined {
  const min = Math.max(Math.ceil(lo), -LIMIT);
  const max = Math.min(Math.floor(hi), LIMIT);
  if (min > max) return undefined;
  const alts: string[] = [];
  if (max >= 0) alts.push(...nonNegative(Math.max(min, 0), max === LIMIT && hi === Infinity ? Infinity : max));
  if (min < 0) {
    const neg = nonNegative(Math.max(1, -max), min === -LIMIT && lo === -Infinity ? Infinity : -min);
    alts.push(`"-" ${neg.length === 1 ? neg[0] : `( ${neg.join(' | ')} )`}`);
  }
  return alts.length === 1 ? alts[0]! : `( ${alts.join(' | ')} )`;
}

export interface NumberBounds {
  min: number;
  max: number;
  exclusiveMin: boolean;
  exclusiveMax: boolean;
}

/**
 * An expression for decimal numbers inside the bounds: integers in range, and numbers with a
 * fraction whose whole part keeps every fraction in range. A subset of the range (0.5 to 0.9 has no
 * such number: `undefined`).
 */
export function numberRange(b: NumberBounds): string | undefined {
  const { min, max, exclusiveMin, exclusiveMax } = b;
  // Six fraction digits at most: with a whole part of up to nine digits the value still parses to
  // the number written, so it cannot round onto an exclusive bound.
  const frac = '[0-9]{1,6}';
  // A fraction that is not zero (for a value just above an exclusive integer bound).
  const nonZeroFrac = '[0-9]{0,5} [1-9]';
  const alts: string[] = [];
  // Whole numbers.
  const whole = integerRange(exclusiveMin && Number.isInteger(min) ? min + 1 : min, exclusiveMax && Number.isInteger(max) ? max - 1 : max);
  if (whole) alts.push(whole);
  {
    // k.f with k ≥ 0: the value is in [k, k+1), inside the range when k ≥ min and k + 1 ≤ max.
    const lo = Math.max(0, Math.ceil(min));
    const hi = Math.min(Math.floor(max) - 1, FRACTION_LIMIT);
    if (exclusiveMin && lo === min && lo <= hi) {
      alts.push(`${integerRange(lo, lo)!} "." ${nonZeroFrac}`);
      const rest = integerRange(lo + 1, hi);
      if (rest) alts.push(`${rest} "." ${frac}`);
    } else {
      const r = integerRange(lo, hi);
      if (r) alts.push(`${r} "." ${frac}`);
    }
    // -k.f with k ≥ 0: the value is in (-(k+1), -k], inside when -k ≤ max (strictly, a zero fraction
    // aside) and -(k+1) ≥ min.
    const nlo = Math.max(0, Math.ceil(-max));
    const nhi = Math.min(Math.floor(-min) - 1, FRACTION_LIMIT);
    if (nlo <= nhi) {
      // "-0.f" is negative only when f is not zero; "-k.0" equals -k, fine unless -k is an exclusive max.
      const zeroFirst = nlo === 0 || (exclusiveMax && -nlo === max);
      if (zeroFirst) {
        alts.push(`"-" ${integerRange(nlo, nlo)!} "." ${nonZeroFrac}`);
        const rest = integerRange(nlo + 1, nhi);
        if (rest) alts.push(`"-" ${rest} "." ${frac}`);
      } else {
        alts.push(`"-" ${integerRange(nlo, nhi)!} "." ${frac}`);
      }
    }
  }
  if (alts.length === 0) return undefined;
  return alts.length === 1 ? alts[0]! : `( ${alts.join(' | ')} )`;
}

/**
 * Values of a `multipleOf` inside the bounds, as JSON literals: the multiples nearest the range's
 * start (or zero), up to `count` of them. Each is kept only if it passes the same test validators
 * apply (`value / m` is an integer in floating point), since 0.07 / 0.01 is not 7 there. A subset of
 * the valid values, but every one exactly valid; none (`[]`) when the range holds no multiple.
 */
export function multiplesIn(m: number, b: NumberBounds, integer: boolean, count = 64): string[] {
  const inRange = (v: number): boolean =>
    (b.exclusiveMin ? v > b.min : v >= b.min) && (b.exclusiveMax ? v < b.max : v <= b.max) && Math.abs(v) <= LIMIT;
  const decimals = Math.min(15, Math.max(0, -Math.floor(Math.log10(m)) + 1));
  const out: string[] = [];
  const seen = new Set<string>();
  // Start at the multiple nearest zero inside the range, then walk outwards in both directions.
  const startK = b.min > 0 ? Math.ceil(b.min / m) : b.max < 0 ? Math.floor(b.max / m) : 0;
  for (let step = 0; out.length < count && step < count * 4; step++) {
    for (const k of step === 0 ? [startK] : [startK + step, startK - step]) {
      const v = Number((k * m).toFixed(decimals));
      const text = JSON.stringify(v);
      if (seen.has(text) || !inRange(v) || (integer && !Number.isInteger(v))) continue;
      const q = v / m;
      if (q !== Math.trunc(q)) continue;
      seen.add(text);
      out.push(text);
    }
  }
  return out;
}
