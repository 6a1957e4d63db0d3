import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';

/** Takes the response over from Fastify for a server-sent-event stream, keeping the headers set so far. */
export function openSse(reply: FastifyReply): void {
  reply.hijack();
  const headers: Record<string, string | number | string[]> = {};
  for (const [k, v] of Object.entries(reply.getHeaders())) if (v !== undefined) headers[k] = v;
  reply.raw.writeHead(200, {
    ...headers,
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  // Each event goes out as soon as it is written.
  reply.raw.socket?.setNoDelay(true);
}

/** Writes one `data:` event (optionally with an `event:` line), waiting for the socket when it is full. */
export async function writeSse(raw: ServerResponse, data: string, event?: string): Promise<void> {
  if (raw.destroyed || raw.writableEnded) return;
  const ok = raw.write(event === undefined ? `data: ${data}\n\n` : `event: ${event}\ndata: ${data}\n\n`);
  if (!ok && !raw.destroyed) await Promise.race([once(raw, 'drain'), once(raw, 'close')]);
}
