import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';

const SSE_HEADERS = [
  'content-type',
  'text/event-stream; charset=utf-8',
  'cache-control',
  'no-cache',
  'connection',
  'keep-alive',
  'x-accel-buffering',
  'no',
];
const SSE_HEADER_NAMES = new Set(SSE_HEADERS.filter((_, i) => i % 2 === 0));

/** Takes the response over from Fastify for a server-sent-event stream, keeping the headers set so far. */
export function openSse(reply: FastifyReply): void {
  reply.hijack();
  // Node takes the headers as one flat list of names and values, without building another object.
  const headers: string[] = [];
  const set = reply.getHeaders();
  for (const k in set) {
    const v = set[k];
    if (v === undefined || SSE_HEADER_NAMES.has(k)) continue;
    if (Array.isArray(v)) for (const one of v) headers.push(k, one);
    else headers.push(k, String(v));
  }
  headers.push(...SSE_HEADERS);
  reply.raw.writeHead(200, headers);
  // Each event goes out as soon as it is written.
  reply.raw.socket?.setNoDelay(true);
}

const uncork = (raw: ServerResponse): void => raw.uncork();

/** Resolves once a full socket has room again (or the client went away). */
export function drained(raw: ServerResponse): Promise<void> {
  if (raw.destroyed) return Promise.resolve();
  // Both listeners go once either fires: racing two once() promises left the loser's listeners on
  // the response, two more for every wait of a slow client's stream.
  return new Promise((resolve) => {
    const done = () => {
      raw.off('drain', done);
      raw.off('close', done);
      resolve();
    };
    raw.on('drain', done);
    raw.on('close', done);
  });
}

/**
 * Writes one `data:` event (optionally with an `event:` line). Events written in the same tick (an
 * upstream network read often carries several) leave in one socket write: the response is corked
 * until the next tick, which adds no wait. Returns false when the socket is full: await drained().
 */
export function writeSse(raw: ServerResponse, data: string, event?: string): boolean {
  return writeFrames(raw, event === undefined ? `data: ${data}\n\n` : `event: ${event}\ndata: ${data}\n\n`);
}

/** Writes events already framed (`event:`/`data:` lines and the blank line), corked like writeSse. */
export function writeFrames(raw: ServerResponse, frames: string): boolean {
  if (raw.destroyed || raw.writableEnded || frames === '') return true;
  if (raw.writableCorked === 0) {
    raw.cork();
    process.nextTick(uncork, raw);
  }
  return raw.write(frames);
}
