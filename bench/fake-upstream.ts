/**
 * A fake OpenAI-compatible upstream for the gateway benchmarks, run as its own process:
 * `node dist/bench/fake-upstream.js <port>`. Non-stream requests get one fixed JSON answer; stream
 * requests get 20 content chunks, a usage chunk and `[DONE]`, written at once. The model `hold`
 * streams one chunk and then holds the stream open until the client goes away (idle-stream memory).
 * `POST /v1/responses` (a Responses upstream, always streamed, as Switchyard calls one) answers with
 * the same 20 pieces of text as Responses events: the lifecycle, 20 `response.output_text.delta`
 * events and `response.completed` with usage. The model `short` streams one piece instead of 20,
 * in either protocol (what a stream's events cost, by difference: bench/per-event.ts).
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
const RESPONSE = { id: 'resp_fake', object: 'response', created_at: 1_700_000_000, model: 'fake', output: [] as unknown[] };
const MESSAGE = { id: 'msg_fake', type: 'message', role: 'assistant' };
function responsesStream(pieces: readonly string[]): string[] {
  let seq = 0;
  const responsesEvent = (type: string, fields: Record<string, unknown>): string =>
    `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...fields })}\n\n`;
  const text = pieces.join('');
  return [
    responsesEvent('response.created', { response: { ...RESPONSE, status: 'in_progress' } }),
    responsesEvent('response.in_progress', { response: { ...RESPONSE, status: 'in_progress' } }),
    responsesEvent('response.output_item.added', { output_index: 0, item: { ...MESSAGE, status: 'in_progress', content: [] } }),
    responsesEvent('response.content_part.added', {
      item_id: 'msg_fake',
      output_index: 0,
      content_index: 0,
      part: { type: 'output_text', text: '', annotations: [] },
    }),
    ...pieces.map((delta) =>
      responsesEvent('response.output_text.delta', { item_id: 'msg_fake', output_index: 0, content_index: 0, delta, logprobs: [] }),
    ),
    responsesEvent('response.output_text.done', { item_id: 'msg_fake', output_index: 0, content_index: 0, text, logprobs: [] }),
    responsesEvent('response.content_part.done', {
      item_id: 'msg_fake',
      output_index: 0,
      content_index: 0,
      part: { type: 'output_text', text, annotations: [] },
    }),
    responsesEvent('response.output_item.done', {
      output_index: 0,
      item: { ...MESSAGE, status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] },
    }),
    responsesEvent('response.completed', {
      response: {
        ...RESPONSE,
        status: 'completed',
        output: [{ ...MESSAGE, status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }],
        usage: { input_tokens: 12, output_tokens: pieces.length, total_tokens: 12 + pieces.length },
      },
    }),
  ];
}
const PIECES = Array.from({ length: 20 }, (_, i) => (i === 0 ? 'Hello' : ` word${i}`));
const RESPONSES_STREAM = responsesStream(PIECES);
const RESPONSES_SHORT = responsesStream(PIECES.slice(0, 1));
const SHORT_TAIL = TAIL.replace('"completion_tokens":20,"total_tokens":32', '"completion_tokens":1,"total_tokens":13');
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
    if (req.url?.endsWith('/responses')) {
      // One write per event, as the chat stream's chunks.
      res.writeHead(200, SSE_HEADERS);
      for (const e of body.model === 'short' ? RESPONSES_SHORT : RESPONSES_STREAM) res.write(e);
      res.end();
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
    for (const c of body.model === 'short' ? CHUNKS.slice(-1) : CHUNKS) res.write(c);
    res.end(body.model === 'short' ? SHORT_TAIL : TAIL);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`ready ${typeof address === 'object' && address ? address.port : ''}\n`);
});
process.on('SIGTERM', () => process.exit(0));
