import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A fixture upstream, only for failures a real engine cannot produce on demand. */
export async function fixture(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    server,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

/** A URL nothing listens on. */
export async function deadUrl(): Promise<string> {
  const f = await fixture(() => undefined);
  await f.close();
  return f.url;
}

/** One chat.completion.chunk SSE frame. */
export const chunkFrame = (delta: object, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

/** A whole non-stream chat completion, as an upstream answers it. */
export function completionBody(text: string): string {
  return JSON.stringify({
    id: 'chatcmpl-fixture', object: 'chat.completion', created: 1, model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 },
  });
}
