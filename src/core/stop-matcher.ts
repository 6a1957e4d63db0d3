/**
 * Finds stop sequences in streamed text. Text that could still turn out to be the start of a stop
 * sequence is held back, so a client never sees part of one; everything else passes at once.
 */
export class StopMatcher {
  private held = '';
  private readonly longest: number;
  /** The stop sequence that ended the text, once one did (Anthropic's Messages report it). */
  matched: string | undefined;

  constructor(private readonly stops: readonly string[]) {
    this.longest = stops.reduce((m, s) => Math.max(m, s.length), 0);
  }

  /** Returns the text safe to emit now, and whether a stop sequence was reached. */
  push(text: string): { emit: string; stopped: boolean } {
    if (this.longest === 0) return { emit: text, stopped: false };
    const buf = this.held + text;
    let cut = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) {
        cut = i;
        this.matched = s;
      }
    }
    if (cut >= 0) {
      this.held = '';
      return { emit: buf.slice(0, cut), stopped: true };
    }
    const keep = this.partialSuffix(buf);
    this.held = buf.slice(buf.length - keep);
    return { emit: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** What is still held back once generation ends without a stop sequence. */
  flush(): string {
    const out = this.held;
    this.held = '';
    return out;
  }

  /** Length of the longest suffix of buf that is a proper prefix of some stop sequence. */
  private partialSuffix(buf: string): number {
    for (let n = Math.min(buf.length, this.longest - 1); n > 0; n--) {
      const tail = buf.slice(buf.length - n);
      if (this.stops.some((s) => s.startsWith(tail))) return n;
    }
    return 0;
  }
}
