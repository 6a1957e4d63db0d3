import type { GenerationEvent } from '../../core/canonical.js';

type CallStart = Extract<GenerationEvent, { type: 'tool_call.start' }>;

/**
 * Tool calls one after another. A chat-completions stream may interleave the deltas of parallel
 * calls (each delta names its call by `index`), but the Messages and Responses renderers, like
 * their protocols, write one call's block or item at a time: an interleaved delta was dropped or
 * appended to the call that was open (a hostile pass got `{"ci` and `{"tz":ty":"Paris"}"UTC"}`).
 * The first call goes on as it comes; a call that starts while it is open is held, with its
 * arguments, and given whole once the stream has ended. An upstream that sends its calls one
 * after another (OpenAI does) loses only the streaming of the second and later calls' arguments.
 */
export class CallOrder {
  private open: number | undefined;
  private readonly held = new Map<number, { start: CallStart; args: string }>();

  /** Passes a batch on with the calls in order (in place): what belongs to a held call is kept back. */
  order(events: GenerationEvent[]): GenerationEvent[] {
    let n = 0;
    for (const ev of events) {
      if (ev.type === 'tool_call.start') {
        if (this.open === undefined || this.open === ev.index) this.open = ev.index;
        else {
          if (!this.held.has(ev.index)) this.held.set(ev.index, { start: ev, args: '' });
          continue;
        }
      } else if (ev.type === 'tool_call.delta' && ev.index !== this.open) {
        const call = this.held.get(ev.index);
        if (call) {
          call.args += ev.arguments;
          continue;
        }
      }
      events[n++] = ev;
    }
    events.length = n;
    return events;
  }

  /** The held calls, whole, in the order of their indexes: after the last event of the stream. */
  flush(): GenerationEvent[] {
    const out: GenerationEvent[] = [];
    for (const index of [...this.held.keys()].sort((a, b) => a - b)) {
      const { start, args } = this.held.get(index)!;
      out.push(start);
      if (args !== '') out.push({ type: 'tool_call.delta', index, arguments: args });
    }
    this.held.clear();
    return out;
  }
}
