/** A CR that is not the first half of a CRLF (at the end of a read it may be one: see `lfAfterCr`). */
const LONE_CR = /\r(?!\n)/;
const CR_LINE_ENDS = /\r\n?/g;
const BOM = 0xfeff;

/**
 * An upstream's SSE text, read by read, made what both of the gateway's SSE readers expect: the
 * chat fast lane scans for LF and CRLF line ends, and eventsource-parser (3.1) strips a BOM only as
 * the three characters of its UTF-8 bytes (the decoded text has U+FEFF) and holds a CR that ends
 * what it was fed, waiting for an LF, so the last event of a CR-only stream ("data: [DONE]\r\r")
 * never came out.
 *
 * - SSE lines end with LF, CRLF or a lone CR. A read that holds a lone CR has its line ends made
 *   LFs, as a client's SSE parser reads them. A CR that ends a read may be the first half of a CRLF,
 *   so an LF that starts the next read is dropped. Reads with LF or CRLF only (what chat servers
 *   write) are passed on as they are, after one `includes`.
 * - A BOM at the start of the stream is dropped, as SSE says (before, it made the first line an
 *   unknown field, and the first event was lost).
 */
export class SseInput {
  private started = false;
  private lfAfterCr = false;

  /** The text of the next read (decoded), as the readers take it. */
  push(text: string): string {
    if (text === '') return text;
    if (!this.started) {
      this.started = true;
      if (text.charCodeAt(0) === BOM) text = text.slice(1);
    }
    if (this.lfAfterCr) {
      this.lfAfterCr = false;
      if (text.charCodeAt(0) === 10) text = text.slice(1);
    }
    if (!text.includes('\r') || !LONE_CR.test(text)) return text;
    this.lfAfterCr = text.charCodeAt(text.length - 1) === 13;
    return text.replace(CR_LINE_ENDS, '\n');
  }
}
