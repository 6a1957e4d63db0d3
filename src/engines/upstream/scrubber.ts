/**
 * Keeps a deployment's API key out of everything an upstream sends that can reach a client, a log or
 * the database: error messages, stream error frames, and the generated text itself (an upstream
 * can quote the credential it was sent anywhere). The key is matched as it is, JSON- or
 * percent-escaped, and base64-encoded at each of the three byte alignments.
 */
export const REDACTED = '[redacted]';

/** Shorter keys are not scrubbed: matching a few characters would mangle ordinary text. */
const MIN_SECRET = 8;
/** The most of a key's start a stream cut short may end with (see StreamScrubber.flush). */
const SHOWN = 4;

/** Substrings of base64(x + key) that depend on the key alone, for x of 0, 1 and 2 bytes. */
function base64Forms(key: string): string[] {
  const bytes = Buffer.from(key, 'utf8');
  const out: string[] = [];
  for (let pad = 0; pad < 3; pad++) {
    const enc = Buffer.concat([Buffer.alloc(pad), bytes]).toString('base64');
    // Characters touched by the padding bytes or by what follows the key are left out.
    const start = Math.ceil((pad * 4) / 3);
    const end = Math.floor(((pad + bytes.length) * 4) / 3);
    const core = enc.slice(start, end);
    if (core.length >= MIN_SECRET) out.push(core);
  }
  return out;
}

/** `\u0073` and `\/` escapes written out, as a JSON string would read. */
function unescapeJson(text: string): string {
  return text.replace(/\\u([0-9a-fA-F]{4})|\\\//g, (_m, hex: string | undefined) => (hex ? String.fromCharCode(parseInt(hex, 16)) : '/'));
}

function unescapePercent(text: string): string {
  return text.replace(/%([0-9a-fA-F]{2})/g, (_m, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

export class Scrubber {
  private readonly forms: string[];
  private readonly longest: number;

  constructor(secret: string | undefined) {
    this.forms = secret && secret.length >= MIN_SECRET ? [secret, ...base64Forms(secret)] : [];
    this.longest = this.forms.reduce((m, f) => Math.max(m, f.length), 0);
  }

  get active(): boolean {
    return this.forms.length > 0;
  }

  private replace(text: string): string {
    let out = text;
    for (const f of this.forms) if (out.includes(f)) out = out.split(f).join(REDACTED);
    return out;
  }

  /** A whole text (an error body or message, a name): the key in any of its encodings is replaced. */
  text(text: string): string {
    if (!this.active || text.length < MIN_SECRET) return text;
    let out = this.replace(text);
    // Escaped forms: read the text as unescaped, and keep that reading when it held the key.
    for (const decode of [unescapeJson, unescapePercent, (t: string) => unescapePercent(unescapeJson(t))]) {
      const decoded = decode(out);
      if (decoded === out) continue;
      const scrubbed = this.replace(decoded);
      if (scrubbed !== decoded) out = scrubbed;
    }
    return out;
  }

  /** A scrubber for one stream of text deltas, where the key may be split across deltas. */
  stream(): StreamScrubber {
    return new StreamScrubber(this.forms, this.longest);
  }
}

/**
 * Scrubs streamed text: a tail that could be the start of the key is held back until the next
 * delta shows whether it is (the same technique as stop strings), so nothing is delayed otherwise.
 */
export class StreamScrubber {
  private held = '';

  constructor(
    private readonly forms: readonly string[],
    private readonly longest: number,
  ) {}

  push(text: string): string {
    if (this.forms.length === 0) return text;
    let buf = this.held + text;
    for (const f of this.forms) if (buf.includes(f)) buf = buf.split(f).join(REDACTED);
    let keep = 0;
    for (let n = Math.min(buf.length, this.longest - 1); n > 0; n--) {
      const tail = buf.slice(buf.length - n);
      if (this.forms.some((f) => f.startsWith(tail))) {
        keep = n;
        break;
      }
    }
    this.held = buf.slice(buf.length - keep);
    return buf.slice(0, buf.length - keep);
  }

  /**
   * The text held back, at the end of its channel. A stream cut short (at the output limit, a stop
   * string, an error) ends wherever the client chose: flushing the held start of the key as text let
   * a client read it one character more per request by moving `max_tokens` (a hostile pass read 31
   * of 32). A held start of SHOWN characters or more is redacted; fewer tell nothing (keys begin
   * with a public prefix such as `sk-`).
   */
  flush(): string {
    const out = this.held;
    this.held = '';
    return out.length >= SHOWN ? REDACTED : out;
  }
}
