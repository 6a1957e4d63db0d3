import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startServer, tempDir, type TestServer } from './server.js';

/** The catalogue model a gateway serves only through its upstream deployments. */
export const GATEWAY_MODEL = 'meta-llama/tiny-stories';

/**
 * A Switchyard whose only way to serve GATEWAY_MODEL is the given deployments (ids d0, d1, …).
 * `model` adds to (or overrides) the catalogue entry, e.g. its context length or pricing.
 */
export function startGateway(
  deployments: Array<{ baseUrl: string; weight?: number; upstreamModel?: string; apiKeyEnv?: string }>,
  env: Record<string, string> = {},
  model: Record<string, unknown> = {},
): Promise<TestServer> {
  return startServer({
    modelsDir: tempDir(),
    env,
    configFile: {
      name: 'gw.json',
      text: JSON.stringify({
        defaultCatalogue: false,
        models: [{ id: GATEWAY_MODEL, name: 'TinyStories via upstream', context_length: 512, ...model }],
        deployments: deployments.map((d, i) => ({ model: GATEWAY_MODEL, id: `d${i}`, ...d })),
      }),
    },
  });
}

/**
 * A Switchyard whose catalogue is exactly `models`, served by `deployments` (fixture upstreams on
 * loopback, which the address policy is told to allow).
 */
export function startCatalogueGateway(models: object[], deployments: object[]): Promise<TestServer> {
  return startServer({
    modelsDir: tempDir(),
    env: { SWITCHYARD_UPSTREAM_ALLOW: '127.0.0.1' },
    configFile: { name: 'gw.json', text: JSON.stringify({ defaultCatalogue: false, models, deployments }) },
  });
}

/** Things a suite opened, closed in reverse order by `closeAll` (in an after hook). */
export function closers(): {
  keep<T extends { close(): Promise<void> }>(x: T): T;
  add(fn: () => Promise<void>): void;
  closeAll(): Promise<void>;
} {
  const list: Array<() => Promise<void>> = [];
  return {
    keep(x) {
      list.push(() => x.close());
      return x;
    },
    add(fn) {
      list.push(fn);
    },
    async closeAll() {
      for (const c of list.reverse()) await c();
    },
  };
}

/** A fixture upstream, only for failures a real engine cannot produce on demand. */
export async function fixture(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    server,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** A fixture upstream that reads each request's JSON body and hands it to `answer`, parsed. */
export function jsonFixture<T = Record<string, unknown>>(
  answer: (body: T, res: ServerResponse, req: IncomingMessage) => void,
): ReturnType<typeof fixture> {
  return fixture((req, res) => {
    let raw = '';
    req.on('data', (c: Buffer) => {
      raw += c.toString();
    });
    req.on('end', () => answer(JSON.parse(raw) as T, res, req));
  });
}

/**
 * A fixture chat-completions upstream: `answer` writes the reply to each request, told whether the
 * request asked for a stream.
 */
export function chatFixture(answer: (stream: boolean, res: ServerResponse) => void): ReturnType<typeof fixture> {
  return jsonFixture<{ stream?: boolean }>((body, res) => answer(body.stream === true, res));
}

/** A whole non-stream chat completion with this message, finish reason and usage, as JSON text. */
export const completionJson = (message: object, finish: string, usage: unknown): string =>
  JSON.stringify({
    id: 'x',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [{ index: 0, message, finish_reason: finish }],
    usage,
  });

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
    id: 'chatcmpl-fixture',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 },
  });
}
