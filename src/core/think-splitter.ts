/**
 * Splits a local model's output into thought and answer: models that reason (Qwen3, DeepSeek-R1
 * distills, …) open with `<think>` and close with `</think>` before answering. Tags split across
 * tokens are held back until they are known, so neither tag reaches the client.
 */
const OPEN = '<think>';
const CLOSE = '</think>';

export type Piece = { kind: 'reasoning' | 'text'; text: string };

/** Length of the longest suffix of `s` that is a proper prefix of `tag`. */
function partial(s: string, tag: string): number {
  for (let n = Math.min(s.length, tag.length - 1); n > 0; n--) if (tag.startsWith(s.slice(s.length - n))) return n;
  return 0;
}

export class ThinkSplitter {
  private state: 'start' | 'thinking' | 'answer' = 'start';
  private held = '';
  /** Right after `</think>`: the blank lines before the answer are dropped. */
  private trimLead = false;

  get thinking(): boolean {
    return this.state === 'thinking';
  }

  push(text: string): Piece[] {
    const out: Piece[] = [];
    let buf = this.held + text;
    this.held = '';
    if (this.state === 'start') {
      const lead = buf.trimStart();
      if (lead.startsWith(OPEN)) {
        this.state = 'thinking';
        buf = lead.slice(OPEN.length);
      } else if (OPEN.startsWith(lead)) {
        this.held = buf;
        return out;
      } else {
        this.state = 'answer';
      }
    }
    if (this.state === 'thinking') {
      const end = buf.indexOf(CLOSE);
      if (end < 0) {
        const keep = partial(buf, CLOSE);
        this.held = buf.slice(buf.length - keep);
        if (buf.length > keep) out.push({ kind: 'reasoning', text: buf.slice(0, buf.length - keep) });
        return out;
      }
      if (end > 0) out.push({ kind: 'reasoning', text: buf.slice(0, end) });
      this.state = 'answer';
      this.trimLead = true;
      buf = buf.slice(end + CLOSE.length);
    }
    if (this.trimLead) {
      buf = buf.replace(/^\s+/, '');
      if (buf) this.trimLead = false;
    }
    if (buf) out.push({ kind: 'text', text: buf });
    return out;
  }

  flush(): Piece[] {
    const rest = this.held;
    this.held = '';
    if (!rest) return [];
    return [{ kind: this.state === 'thinking' ? 'reasoning' : 'text', text: rest }];
  }
}
