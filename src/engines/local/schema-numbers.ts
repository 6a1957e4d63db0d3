/**
 * Numeric ranges as GBNF. Integers in a range are matched exactly (the classic split of a decimal
 * range into digit patterns); numbers with fractions in a range are matched as a subset: whole
 * integer parts inside the range, each with any fraction, and at the range's ends, where a bound
 * cuts a whole part, that part with the fractions of a fixed number of digits that lie inside. Every
 * value these rules accept lies in the range, which is what the grammar guarantee needs; where a
 * range leaves no such value (the caller checks `undefined`), the schema's own check has to do.
 */

/** Integers open above are written with at most this many digits (as the base `integer` rule). */
const MAX_DIGITS = 15;
const LIMIT = 10n ** BigInt(MAX_DIGITS) - 1n;
/** Whole parts written before a fraction (see `numberRange`). */
const FRACTION_LIMIT = 999_999_999;
/** Significant digits a cut whole part's numbers are written with at most (a double needs up to 17 to be told apart). */
const MAX_SIGNIFICANT = 17;
/** The largest integer a double holds: open ranges stop there (a longer number parses to Infinity). */
const LARGEST = BigInt(Number.MAX_VALUE);

const digitClass = (lo: number, hi: number): string => (lo === hi ? `"${lo}"` : lo === 0 && hi === 9 ? '[0-9]' : `[${lo}-${hi}]`);
const anyDigits = (n: number): string => (n === 0 ? '' : n === 1 ? '[0-9]' : `[0-9]{${n}}`);
const alternatives = (alts: string[]): string => (alts.length === 1 ? alts[0]! : `( ${alts.join(' | ')} )`);

/** Alternatives matching every digit string from `lo` to `hi`, both of the same length (leading zeros kept). */
function sameLength(lo: string, hi: string): string[] {
  if (lo.length === 1) return [digitClass(Number(lo), Number(hi))];
  const a = Number(lo[0]);
  const b = Number(hi[0]);
  const restLo = lo.slice(1);
  const restHi = hi.slice(1);
  if (a === b) return [`"${a}" ${alternatives(sameLength(restLo, restHi))}`];
  const zeros = '0'.repeat(restLo.length);
  const nines = '9'.repeat(restLo.length);
  if (restLo === zeros && restHi === nines) return [`${digitClass(a, b)} ${anyDigits(restLo.length)}`];
  const out: string[] = [];
  let from = a;
  let to = b;
  if (restLo !== zeros) {
    out.push(`"${a}" ${alternatives(sameLength(restLo, nines))}`);
    from = a + 1;
  }
  if (restHi !== nines) to = b - 1;
  if (from <= to) out.push(`${digitClass(from, to)} ${anyDigits(restLo.length)}`);
  if (restHi !== nines) out.push(`"${b}" ${alternatives(sameLength(zeros, restHi))}`);
  return out;
}

/**
 * Alternatives for the non-negative integers in [lo, hi] (hi undefined: open above), without leading
 * zeros. Above a bound of more than MAX_DIGITS digits, only numbers as long as the bound are written
 * (a subset: a bound of 10^20 needs no 300-digit numbers).
 */
function nonNegative(lo: bigint, hi: bigint | undefined): string[] {
  const out: string[] = [];
  const longest = (n: bigint): bigint => {
    const all = 10n ** BigInt(String(n).length) - 1n;
    return all < LARGEST ? all : LARGEST;
  };
  const cap = lo > LIMIT ? longest(lo) : LIMIT;
  const top = hi === undefined || hi > cap ? cap : hi;
  const open = hi === undefined || hi > cap;
  let start = lo;
  while (start <= top) {
    const digits = String(start).length;
    const end = longest(start) < top ? longest(start) : top;
    if (open && end === longest(start) && digits < MAX_DIGITS && cap === LIMIT) {
      // Open above: every longer number, in one alternative.
      out.push(...sameLength(String(start), String(end)));
      out.push(`[1-9] [0-9]{${digits},${MAX_DIGITS - 1}}`);
      return out;
    }
    out.push(...sameLength(String(start), String(end)));
    start = end + 1n;
  }
  return out;
}

/** The double after `x` (toward +Infinity), for an exclusive bound where x + 1 is x again. */
function nextUp(x: number): number {
  if (x === 0) return Number.MIN_VALUE;
  const f = new Float64Array([x]);
  const bits = new BigInt64Array(f.buffer);
  bits[0] = bits[0]! + (x > 0 ? 1n : -1n);
  return f[0]!;
}

/**
 * The least and greatest integers a range holds, as doubles (either may be infinite): an exclusive
 * bound that is an integer moves to the next integer, which beyond 2^53 is the next double (where
 * `x + 1` is `x`, and a number written between the two would parse back to the bound).
 */
export function integerBounds(b: NumberBounds): [number, number] {
  const lo = b.exclusiveMin && Number.isInteger(b.min) ? (Math.abs(b.min) < 2 ** 53 ? b.min + 1 : nextUp(b.min)) : Math.ceil(b.min);
  const hi = b.exclusiveMax && Number.isInteger(b.max) ? (Math.abs(b.max) < 2 ** 53 ? b.max - 1 : -nextUp(-b.max)) : Math.floor(b.max);
  return [lo, hi];
}

/**
 * An expression matching the integers in [lo, hi] (either may be infinite), written as JSON writes
 * them: exactly, up to MAX_DIGITS digits; past them, those with as many digits as the bound.
 * `undefined` when there are none. Every digit string in the range parses to a double in the range
 * (rounding to the nearest double is monotonic, and the bounds are doubles), so large bounds hold.
 */
export function integerRange(lo: number, hi: number): string | undefined {
  const min = Math.ceil(lo);
  const max = Math.floor(hi);
  // Past the largest double (an exclusive bound at Number.MAX_VALUE) no number is left.
  if (!(min <= max) || min === Infinity || max === -Infinity) return undefined;
  const alts: string[] = [];
  if (max >= 0) alts.push(...nonNegative(min > 0 ? BigInt(min) : 0n, max === Infinity ? undefined : BigInt(max)));
  if (min < 0) {
    const neg = nonNegative(max < -1 ? BigInt(-max) : 1n, min === -Infinity ? undefined : BigInt(-min));
    alts.push(`"-" ${alternatives(neg)}`);
  }
  return alternatives(alts);
}

export interface NumberBounds {
  min: number;
  max: number;
  exclusiveMin: boolean;
  exclusiveMax: boolean;
}

/** Whether `v` lies inside the bounds. */
const inside = (v: number, b: NumberBounds): boolean =>
  (b.exclusiveMin ? v > b.min : v >= b.min) && (b.exclusiveMax ? v < b.max : v <= b.max);

/**
 * The numbers `sign` `k` `.` f, with f of a fixed number of digits, that lie inside the bounds: a
 * whole part the range cuts (0.5 to 0.6 gives `0.500` to `0.600`). The digits are enough for a
 * hundred or so values over the part of the unit that is inside, and each value is tested as it
 * parses, so a bound that is not a double's exact decimal is still kept. Undefined when none does.
 */
function cutWholePart(k: number, sign: '' | '-', b: NumberBounds): string | undefined {
  // The part of [k, k+1) (in magnitude) inside the range.
  const from = sign === '' ? Math.max(k, b.min) : Math.max(k, -b.max);
  const to = sign === '' ? Math.min(k + 1, b.max) : Math.min(k + 1, -b.min);
  if (!(to >= from)) return undefined;
  // A whole number alone: the integer rule writes it.
  if (to === from && Number.isInteger(from)) return undefined;
  // Fraction digits left once the whole part's are written (a zero whole part has none: 0.30000000000000004).
  const room = k === 0 ? MAX_SIGNIFICANT + 3 : MAX_SIGNIFICANT - String(k).length;
  // A single value is written with its own digits (0.5, not 0.500000).
  const single = /^\d+\.(\d+)$/.exec(String(from))?.[1]?.length;
  const digits = Math.min(
    room,
    to === from && single !== undefined ? single : Math.max(2, Math.ceil(-Math.log10(Math.max(to - from, Number.MIN_VALUE))) + 2),
  );
  if (digits < 1) return undefined;
  const count = 10n ** BigInt(digits);
  const pad = (f: bigint): string => String(f).padStart(digits, '0');
  const value = (f: bigint): number => Number(`${sign}${k}.${pad(f)}`);
  // Values move one way with f (parsing rounds monotonically): the ones inside are one run of f,
  // found at both ends by bisection, in BigInt since f may pass 2^53.
  const rising = sign === '';
  const aboveMin = (f: bigint): boolean => (b.exclusiveMin ? value(f) > b.min : value(f) >= b.min);
  const belowMax = (f: bigint): boolean => (b.exclusiveMax ? value(f) < b.max : value(f) <= b.max);
  // The first f for which `ok` holds, where it holds from some f on (count if never).
  const first = (ok: (f: bigint) => boolean): bigint => {
    let lo = 0n;
    let hi = count;
    while (lo < hi) {
      const mid = (lo + hi) / 2n;
      if (ok(mid)) hi = mid;
      else lo = mid + 1n;
    }
    return lo;
  };
  const fa = first(rising ? aboveMin : belowMax);
  const fb = first(rising ? (f) => !belowMax(f) : (f) => !aboveMin(f)) - 1n;
  // Every digit string from fa's to fb's parses between their values, so inside.
  if (fa > fb || !inside(value(fa), b) || !inside(value(fb), b)) return undefined;
  return `${sign ? '"-" ' : ''}"${k}" "." ${alternatives(sameLength(pad(fa), pad(fb)))}`;
}

/**
 * An expression for decimal numbers inside the bounds: integers in range, numbers with a fraction
 * whose whole part keeps every fraction in range, and at each end of the range that cuts a whole
 * part, that part's fractions of a fixed length that are inside. A subset of the range; undefined
 * when it has no value the rules can write.
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
  const [wholeLo, wholeHi] = integerBounds(b);
  const whole = integerRange(wholeLo, wholeHi);
  if (whole) alts.push(whole);
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
  // The whole parts a bound cuts, which the rules above leave out (0.5 to 0.6 has no other value).
  const cut = new Set<string>();
  for (const bound of [min, max]) {
    if (!Number.isFinite(bound)) continue;
    const k = Math.floor(Math.abs(bound));
    // A positive whole part the k.f rule does not cover, and likewise a negative one.
    if (max >= 0 && (k < lo || k > hi)) cut.add(`+${k}`);
    if (min < 0 && (k < nlo || k > nhi)) cut.add(`-${k}`);
  }
  for (const c of cut) {
    const piece = cutWholePart(Number(c.slice(1)), c[0] === '-' ? '-' : '', b);
    if (piece) alts.push(piece);
  }
  if (alts.length === 0) return undefined;
  return alternatives(alts);
}

/**
 * Values of a `multipleOf` inside the bounds, as JSON literals: the multiples nearest the range's
 * start (or zero), up to `count` of them. Each is kept only if it passes the same test validators
 * apply (`value / m` is an integer in floating point), since 0.07 / 0.01 is not 7 there. A subset of
 * the valid values, but every one exactly valid; none (`[]`) when the range holds no multiple.
 */
export function multiplesIn(m: number, b: NumberBounds, integer: boolean, count = 64): string[] {
  const inRange = (v: number): boolean =>
    (b.exclusiveMin ? v > b.min : v >= b.min) && (b.exclusiveMax ? v < b.max : v <= b.max) && Math.abs(v) <= Number(LIMIT);
  const decimals = Math.min(15, Math.max(0, -Math.floor(Math.log10(m)) + 1));
  const out: string[] = [];
  const seen = new Set<string>();
  // Start at the multiple nearest zero inside the range, then walk outwards in both directions. An
  // integer with a fractional multipleOf (0.001) walks the integers instead: the multiples between
  // two integers are no use to it, and 256 steps of 0.001 from 0.339 never reach 1.
  const byIntegers = integer && !Number.isInteger(m);
  const unit = byIntegers ? 1 : m;
  const startK = b.min > 0 ? Math.ceil(b.min / unit) : b.max < 0 ? Math.floor(b.max / unit) : 0;
  for (let step = 0; out.length < count && step < count * 4; step++) {
    for (const k of step === 0 ? [startK] : [startK + step, startK - step]) {
      const v = byIntegers ? k : Number((k * m).toFixed(decimals));
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
