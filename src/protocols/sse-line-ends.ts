/** A CR that is not the first half of a CRLF (at the end of a read it may be one: see `lfAfterCr`). */
const LONE_CR = /\r(?!\n)/;
const CR_LINE_ENDS = /\r\n?/g;

/**
 * SSE lines end with LF, CRLF or a lone CR. Both of the gateway's SSE readers rest on LF: the chat
 * fast lane scans for LF and CRLF, and eventsource-parser (3.1), which reads CR lines too, holds a
 * CR that ends what it was fed, waiting for an LF, so the last event of a CR-only stream ("data:
 * [DONE]\r\r") never came out. A read that holds a lone CR has its line ends made LFs here, as a
 * client's SSE parser would read them. A CR that ends a read may be the first half of a CRLF, so
 * an LF that starts the next read is dropped. Reads with LF or CRLF only (what chat servers write)
 * are passed on as they are, after one `includes`.
 */
export class SseLineEnds {
  private lfAfterCr = false;

  /** The text of the next read, with lone CRs made LFs. */
  push(text: string): string {
    if (this.lfAfterCr) {
      this.lfAfterCr = false;
      if (text.charCodeAt(0) === 10) text = text.slice(1);
    }
    if (!text.includes('\r') || !LONE_CR.test(text)) return text;
    this.lfAfterCr = text.charCodeAt(text.length - 1) === 13;
    return text.replace(CR_LINE_ENDS, '\n');
  }
}
