/**
 * A fake OpenAI-compatible upstream for the gateway benchmarks, run as its own process:
 * `node dist/bench/fake-upstream.js <port>`. Non-stream requests get one fixed JSON answer; stream
 * requests get 20 content chunks, a usage chunk and `[DONE]`, written at once. The model `hold`
 * streams one chunk and then holds the stream open until the client goes away (idle-stream memory).
 */
import { createServer } from 'node:http';

const ANSWER = Buffer.from(
  JSON.stringify({
    id: 'chatcmpl-fake',
    object: 'chat.completion',
    created: 1_700_000_000,
    model: 'fake',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: 'Hello! This is a fixed answer from the fake upstream.', refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 12, completion_tokens: 11, total_tokens: 23 },
  }),
);
const chunk = (delta: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'fake', choices: [{ index: 0, delta: { content: delta }, logprobs: null, finish_reason: finish }] })}\n\n`;
const CHUNKS = Array.from({ length: 20 }, (_, i) => chunk(i === 0 ? 'Hello' : ` word${i}`, i === 19 ? 'stop' : null));
const TAIL = `data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'fake', choices: [], usage: { prompt_tokens: 12, completion_tokens: 20, total_tokens: 32 } })}\n\ndata: [DONE]\n\n`;
const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };

const server = createServer((req, res) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    let body: { stream?: boolean; model?: string };
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8')) as typeof body;
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"bad json"}}');
      return;
    }
    if (body.stream !== true) {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': ANSWER.length }).end(ANSWER);
      return;
    }
    res.writeHead(200, SSE_HEADERS);
    if (body.model === 'hold') {
      res.write(CHUNKS[0]);
      return;
    }
    for (const c of CHUNKS) res.write(c);
    res.end(TAIL);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`ready ${typeof address === 'object' && address ? address.port : ''}\n`);
});
process.on('SIGTERM', () => process.exit(0));
