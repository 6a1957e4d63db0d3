import { connect } from 'node:net';
import fc from 'fast-check';

/** One generated request, as raw as it goes over the wire. */
export interface FuzzRequest {
  method: string;
  path: string;
  headers: Array<[string, string]>;
  body: Buffer;
  /** Why it was generated, for the failure message. */
  label: string;
}

export interface RawResponse {
  status: number;
  headers: Map<string, string>;
  body: string;
}

const MODEL = 'local/stories260k';

/** A valid body per endpoint family: the fuzzer breaks them one field at a time. */
const TEMPLATES: Record<string, Record<string, unknown>> = {
  '/v1/chat/completions': { model: MODEL, messages: [{ role: 'user', content: 'Once' }], max_tokens: 2, temperature: 0 },
  '/v1/responses': { model: MODEL, input: 'Once', max_output_tokens: 2, store: false },
  '/v1/conversations': { items: [{ type: 'message', role: 'user', content: 'hi' }], metadata: { a: 'b' } },
  '/v1/conversations/conv_x/items': { items: [{ type: 'message', role: 'user', content: 'hi' }] },
  '/admin/keys': { org: 'fuzz-org', name: 'fuzz', role: 'inference', limits: { rpm: 5 } },
  '/admin/orgs': { id: 'fuzz-org', name: 'Fuzz' },
  '/admin/models': { id: 'meta-llama/fuzz-model', context_length: 64, pricing: [{ metric: 'input_tokens', rate: 1 }] },
  '/admin/deployments': { model: 'meta-llama/llama-3.1-8b-instruct', base_url: 'https://example.invalid/v1' },
};

const ODD_IDS = [
  '..',
  '../..',
  '%2e%2e',
  '%2e%2e%2f%2e%2e',
  '%00',
  'a%00b',
  '%ff%fe',
  '%',
  '%zz',
  'x'.repeat(5000),
  '\u00e9\u4e2d',
  '%F0%9F%92%A9',
  'meta-llama%2F..',
  'local/../../etc/passwd',
  '//',
  '?a=%',
  ';',
  '%0d%0aSet-Cookie:x',
  '*',
  'null',
  '-1',
  '1e309',
];

const ROUTES: Array<[string, string]> = [
  ['GET', '/v1/models'],
  ['GET', '/v1/models/{id}'],
  ['GET', '/v1/models/{id}/{id}'],
  ['POST', '/v1/chat/completions'],
  ['POST', '/v1/responses'],
  ['GET', '/v1/responses'],
  ['GET', '/v1/responses/{id}'],
  ['DELETE', '/v1/responses/{id}'],
  ['POST', '/v1/responses/{id}/cancel'],
  ['GET', '/v1/responses/{id}/input_items'],
  ['POST', '/v1/conversations'],
  ['GET', '/v1/conversations'],
  ['GET', '/v1/conversations/{id}'],
  ['POST', '/v1/conversations/{id}'],
  ['DELETE', '/v1/conversations/{id}'],
  ['GET', '/v1/conversations/{id}/items'],
  ['POST', '/v1/conversations/{id}/items'],
  ['GET', '/v1/conversations/{id}/items/{id}'],
  ['DELETE', '/v1/conversations/{id}/items/{id}'],
  ['GET', '/admin/keys'],
  ['POST', '/admin/keys'],
  ['PATCH', '/admin/keys/{id}'],
  ['DELETE', '/admin/keys/{id}'],
  ['GET', '/admin/orgs'],
  ['POST', '/admin/orgs'],
  ['GET', '/admin/orgs/{id}'],
  ['PATCH', '/admin/orgs/{id}'],
  ['GET', '/admin/models'],
  ['POST', '/admin/models'],
  ['GET', '/admin/models/{id}/{id}'],
  ['PATCH', '/admin/models/{id}/{id}'],
  ['DELETE', '/admin/models/{id}/{id}'],
  ['GET', '/admin/deployments'],
  ['POST', '/admin/deployments'],
  ['DELETE', '/admin/deployments/{id}'],
  ['GET', '/admin/usage'],
  ['GET', '/v1/usage'],
  ['GET', '/admin/local/loaded'],
  ['GET', '/nope/{id}'],
];

/** Replaces, deletes or adds one value somewhere in a JSON value. */
function mutate(value: unknown, path: number[], replacement: unknown, mode: 'replace' | 'delete' | 'add'): unknown {
  if (value === null || typeof value !== 'object') return mode === 'delete' ? undefined : replacement;
  const entries: Array<[string, unknown]> = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
  if (entries.length === 0 || path.length === 0) {
    if (mode !== 'add') return replacement;
    return Array.isArray(value) ? [...value, replacement] : { ...value, [`x${path.length}`]: replacement };
  }
  const i = path[0]! % entries.length;
  const [k, v] = entries[i]!;
  const last = path.length === 1;
  const nextValue =
    last && mode === 'delete' ? undefined : last && mode === 'replace' ? replacement : mutate(v, path.slice(1), replacement, mode);
  if (Array.isArray(value)) {
    const copy = [...value];
    if (nextValue === undefined) copy.splice(i, 1);
    else copy[i] = nextValue;
    return copy;
  }
  const copy: Record<string, unknown> = { ...(value as Record<string, unknown>) };
  if (nextValue === undefined) delete copy[k];
  else copy[k] = nextValue;
  return copy;
}

const nested = (depth: number, open: string, close: string): string => open.repeat(depth) + close.repeat(depth);

/** Bodies: broken templates, wrong JSON, not JSON, invalid UTF-8, deep nesting, enormous strings. */
function bodyArb(path: string): fc.Arbitrary<{ body: Buffer; label: string }> {
  const template = TEMPLATES[path] ?? TEMPLATES['/v1/chat/completions']!;
  const json = (v: unknown, label: string) => ({ body: Buffer.from(JSON.stringify(v) ?? 'undefined'), label });
  return fc.oneof(
    {
      weight: 6,
      arbitrary: fc
        .tuple(
          fc.array(fc.nat(), { minLength: 1, maxLength: 4 }),
          fc.anything({ maxDepth: 3 }),
          fc.constantFrom('replace', 'delete', 'add') as fc.Arbitrary<'replace' | 'delete' | 'add'>,
        )
        .map(([p, v, mode]) => json(mutate(template, p, v, mode), `template with ${mode} at ${p.join('.')}`)),
    },
    { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => json(v, 'random JSON')) },
    {
      weight: 2,
      arbitrary: fc.nat({ max: 200 }).map((n) => ({ body: Buffer.from(JSON.stringify(template).slice(0, n)), label: `truncated at ${n}` })),
    },
    { weight: 2, arbitrary: fc.uint8Array({ maxLength: 300 }).map((b) => ({ body: Buffer.from(b), label: 'random bytes' })) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(0xc3, 0xff, 0xed, 0xf8).map((byte) => ({
        body: Buffer.concat([Buffer.from(JSON.stringify(template).slice(0, -2)), Buffer.from([0x22, byte, 0x28, 0x22, 0x7d])]),
        label: `invalid UTF-8 byte ${byte}`,
      })),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(1_000, 100_000).map((d) => ({
        body: Buffer.from(`{"model":"${MODEL}","messages":${nested(d, '[', ']')}}`),
        label: `arrays nested ${d} deep`,
      })),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(1_000, 50_000).map((d) => ({
        body: Buffer.from(
          `{"model":"${MODEL}","input":"x","metadata":${nested(d, '{"a":', '}').replace(/\}$/, '1}')}}`.replace('{"a":}', '1'),
        ),
        label: `objects nested ${d} deep`,
      })),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(1 << 20, 4 << 20).map((n) => json({ ...template, model: 'x'.repeat(n) }, `model id of ${n} bytes`)),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(2 << 20).map((n) => json(mutate(template, [1], 'y'.repeat(n), 'replace'), `string of ${n} bytes`)),
    },
    { weight: 1, arbitrary: fc.constant({ body: Buffer.alloc(0), label: 'empty body' }) },
  );
}

const CONTENT_TYPES = [
  'application/json',
  'application/json; charset=utf-8',
  'text/plain',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=x',
  'application/xml',
  'application/json; charset=latin1',
  '',
  ';;;',
  'application/json, text/plain',
  'x'.repeat(300),
];

/** Headers that are odd but still parse (the raw-header arbitrary below breaks the rest). */
function headerArb(adminKey: string): fc.Arbitrary<Array<[string, string]>> {
  const auth = fc.oneof(
    { weight: 6, arbitrary: fc.constant<Array<[string, string]>>([['authorization', `Bearer ${adminKey}`]]) },
    { weight: 1, arbitrary: fc.constant<Array<[string, string]>>([]) },
    {
      weight: 1,
      arbitrary: fc.string({ maxLength: 80 }).map((s): Array<[string, string]> => [['authorization', s.replace(/[\r\n\0]/g, '')]]),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom<Array<[string, string]>>(
        [['x-api-key', '']],
        [['authorization', 'Bearer']],
        [['authorization', 'Basic Zm9vOmJhcg==']],
        [
          ['authorization', `Bearer ${adminKey}`],
          ['authorization', 'Bearer other'],
        ],
        [['x-api-key', 'sk-' + 'a'.repeat(5000)]],
      ),
    },
  );
  const extra = fc.array(
    fc.tuple(
      fc.constantFrom('x-request-id', 'accept', 'accept-encoding', 'x-forwarded-for', 'origin', 'x-weird'),
      fc.string({ maxLength: 200 }).map((s) => s.replace(/[\r\n\0]/g, '')),
    ),
    { maxLength: 3 },
  );
  return fc
    .tuple(auth, fc.constantFrom(...CONTENT_TYPES), extra)
    .map(([a, ct, e]) => [...a, ...(ct ? [['content-type', ct] as [string, string]] : []), ...e]);
}

export function requestArb(adminKey: string): fc.Arbitrary<FuzzRequest> {
  return fc
    .tuple(
      fc.constantFrom(...ROUTES),
      fc.array(fc.constantFrom(...ODD_IDS, 'resp_123', 'conv_x', 'local', 'stories260k', 'dep_1'), { minLength: 3, maxLength: 3 }),
      fc.constantFrom(
        '',
        '?limit=-1',
        '?type=%zz',
        '?order=sideways&after=%00',
        `?author=${'a'.repeat(3000)}`,
        '?x[y]=1',
        '?group_by=%00&from=1',
      ),
    )
    .chain(([[method, template], ids, query]) => {
      let n = 0;
      const path = template.replace(/\{id\}/g, () => ids[n++]!) + query;
      const base = template.replace(/\{id\}/g, 'conv_x');
      return fc.tuple(
        fc.constant(method),
        fc.constant(path),
        headerArb(adminKey),
        method === 'GET' || method === 'DELETE' ? fc.constant({ body: Buffer.alloc(0), label: 'no body' }) : bodyArb(base),
      );
    })
    .map(([method, path, headers, b]) => ({ method, path, headers, body: b.body, label: b.label }));
}

/** Requests Node's parser must refuse: bad header bytes, an oversized head, broken framing. */
export const rawHeadArb: fc.Arbitrary<{ head: string; label: string }> = fc.oneof(
  fc.constant({ head: `GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(40_000)}\r\n\r\n`, label: 'header over the limit' }),
  fc.constant({ head: 'GET /v1/models HTTP/1.1\r\nhost: x\r\nbad header: 1\r\n\r\n', label: 'space in a header name' }),
  fc.constant({ head: 'GET /v1/models HTTP/1.1\r\nhost: x\r\nx-a: \u0001\u0002\r\n\r\n', label: 'control bytes in a value' }),
  fc.constant({ head: 'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n', label: 'bad content-length' }),
  fc.constant({
    head: 'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n',
    label: 'content-length and chunked',
  }),
  fc.constant({ head: 'GARBAGE\r\n\r\n', label: 'no request line' }),
  fc.constant({ head: 'GET /v1/models HTTP/9.9\r\nhost: x\r\n\r\n', label: 'unknown HTTP version' }),
  fc.string({ maxLength: 200 }).map((s) => ({ head: `${s}\r\n\r\n`, label: 'random head' })),
);

function parse(raw: Buffer): RawResponse & { complete: boolean } {
  const text = raw.toString('latin1');
  const at = text.indexOf('\r\n\r\n');
  const lines = text.slice(0, at < 0 ? text.length : at).split('\r\n');
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(lines[0] ?? '')?.[1] ?? 0);
  const headers = new Map(lines.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
  let body = at < 0 ? '' : text.slice(at + 4);
  let complete = false;
  if (at >= 0) {
    const length = headers.get('content-length');
    if (headers.get('transfer-encoding') === 'chunked') {
      complete = body.endsWith('0\r\n\r\n');
      body = body.replace(/(^|\r\n)[0-9a-f]+\r\n/g, '');
    } else {
      complete = length !== undefined && Buffer.byteLength(body, 'latin1') >= Number(length);
    }
  }
  return { status, headers, body: Buffer.from(body, 'latin1').toString('utf8'), complete };
}

/**
 * Sends raw bytes on a fresh keep-alive connection and reads one reply. The reply is taken as soon
 * as it is complete: a server may answer (401, 413) before it has read a large body, and waiting
 * for the close would race the reset that a close with unread bytes causes.
 */
export function sendRaw(port: number, bytes: Buffer, opts: { end?: boolean; timeoutMs?: number } = {}): Promise<RawResponse> {
  const timeoutMs = opts.timeoutMs ?? 15_000;
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const parts: Buffer[] = [];
    let settled = false;
    const finish = (r: RawResponse) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => {
      settled = true;
      socket.destroy();
      reject(new Error('no answer (hang)'));
    }, timeoutMs);
    socket.on('data', (d: Buffer) => {
      parts.push(d);
      const r = parse(Buffer.concat(parts));
      if (r.complete) finish(r);
    });
    socket.on('error', () => undefined);
    socket.on('close', () => finish(parse(Buffer.concat(parts))));
    // Ending our side makes an incomplete request finish at once instead of waiting for more bytes.
    if (opts.end) socket.end(bytes);
    else socket.write(bytes);
  });
}

export function encode(r: FuzzRequest): Buffer {
  const head = [`${r.method} ${r.path} HTTP/1.1`, 'host: 127.0.0.1', ...r.headers.map(([k, v]) => `${k}: ${v}`)];
  if (r.body.length || r.method === 'POST') head.push(`content-length: ${r.body.length}`);
  return Buffer.concat([Buffer.from(`${head.join('\r\n')}\r\n\r\n`, 'latin1'), r.body]);
}

/** Values a schema keyword may be given by a careless or hostile client. */
const oddValue = fc.oneof(
  fc.integer({ min: -5, max: 50 }),
  fc.constantFrom(-1, 0, 1.5, 1e9, 100_000, 2 ** 53, Number.MAX_SAFE_INTEGER),
  fc.boolean(),
  fc.constant(null),
  fc.string({ maxLength: 12 }),
  fc.constantFrom(
    'integer',
    'number',
    'string',
    'object',
    'array',
    'boolean',
    'null',
    'date-time',
    'email',
    '#',
    '#/$defs/a',
    '#/definitions/b',
    'http://x/y#',
  ),
);

/**
 * JSON schemas, valid and not: every keyword the grammar compiler knows (and some it refuses),
 * nested, with values of the wrong type, dangling and recursive references, huge counts.
 */
export const schemaArb: fc.Arbitrary<unknown> = fc.letrec<{ schema: unknown }>((tie) => ({
  schema: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constantFrom<unknown>(
      true,
      false,
      {},
      { type: 'string' },
      { type: 'integer' },
      { type: 'boolean' },
      { type: 'null' },
      { type: 'number' },
      { $ref: '#' },
    ),
    fc.record(
      {
        type: fc.oneof(
          fc.constantFrom('object', 'array', 'string', 'integer', 'number', 'boolean', 'null', 'nope'),
          fc.constant(['string', 'null']),
          oddValue,
        ),
        properties: fc.dictionary(fc.string({ minLength: 1, maxLength: 6 }), tie('schema'), { maxKeys: 4 }),
        required: fc.oneof(fc.array(fc.string({ maxLength: 6 }), { maxLength: 3 }), oddValue),
        additionalProperties: fc.oneof(fc.boolean(), tie('schema'), oddValue),
        items: fc.oneof(tie('schema'), fc.array(tie('schema'), { maxLength: 3 })),
        prefixItems: fc.array(tie('schema'), { maxLength: 3 }),
        enum: fc.oneof(fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 5 }), oddValue),
        const: fc.jsonValue({ maxDepth: 2 }),
        anyOf: fc.array(tie('schema'), { maxLength: 3 }),
        oneOf: fc.array(tie('schema'), { maxLength: 3 }),
        allOf: fc.array(tie('schema'), { maxLength: 3 }),
        $ref: fc.constantFrom('#', '#/$defs/a', '#/definitions/a', '#/properties/x', '#/nowhere', 'other.json', '#/$defs/%zz'),
        $defs: fc.dictionary(fc.constantFrom('a', 'b'), tie('schema'), { maxKeys: 2 }),
        definitions: fc.dictionary(fc.constantFrom('a', 'b'), tie('schema'), { maxKeys: 2 }),
        minItems: oddValue,
        maxItems: oddValue,
        minLength: oddValue,
        maxLength: oddValue,
        minProperties: oddValue,
        maxProperties: oddValue,
        format: fc.constantFrom('date', 'time', 'date-time', 'email', 'uuid', 'made-up'),
        pattern: fc.constantFrom('^[a-z]+$', '(', '.*', '^a$', '^[a-z]', '[0-9]{3}$', '^(ab|c)'),
        minimum: oddValue,
        nullable: fc.boolean(),
        description: fc.string({ maxLength: 20 }),
        unknownKeyword: fc.jsonValue({ maxDepth: 1 }),
      },
      { requiredKeys: [] },
    ),
  ),
})).schema;

/**
 * How a misbehaving upstream may answer a chat-completions request. (Not 429: its retry-after cools
 * the deployment, and the next requests would never reach the upstream; that path has its own tests.)
 */
export interface UpstreamBehaviour {
  status: number;
  /** The reply body, or, for `sse`, the frames (each written as its own network chunk). */
  body: string;
  sse: string[] | undefined;
  label: string;
}

const chunk = (delta: unknown, extra: Record<string, unknown> = {}): string =>
  `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;

export const upstreamBehaviourArb: fc.Arbitrary<UpstreamBehaviour> = fc.oneof(
  fc.record({
    status: fc.constantFrom(200),
    body: fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)),
    sse: fc.constant(undefined),
    label: fc.constant('random JSON answer'),
  }),
  fc.record({
    status: fc.constantFrom(200, 400, 401, 404, 413, 422, 500, 502, 503),
    body: fc.string({ maxLength: 300 }),
    sse: fc.constant(undefined),
    label: fc.constant('random text'),
  }),
  fc.record({
    status: fc.constant(200),
    body: fc.constant(''),
    sse: fc.array(
      fc.oneof(
        fc.jsonValue({ maxDepth: 3 }).map((v) => `data: ${JSON.stringify(v)}\n\n`),
        fc.anything({ maxDepth: 2 }).map((d) => chunk(d)),
        fc
          .record(
            {
              content: fc.oneof(fc.string(), oddValue),
              tool_calls: fc.oneof(
                fc.array(fc.record({ index: oddValue, id: oddValue, function: fc.record({ name: oddValue, arguments: oddValue }) }), {
                  maxLength: 2,
                }),
                oddValue,
              ),
            },
            { requiredKeys: [] },
          )
          .map((d) => chunk(d)),
        fc
          .record(
            { prompt_tokens: oddValue, completion_tokens: oddValue, prompt_tokens_details: fc.record({ cached_tokens: oddValue }) },
            { requiredKeys: [] },
          )
          .map((u) => `data: ${JSON.stringify({ choices: [], usage: u })}\n\n`),
        fc.constantFrom(
          'data: [DONE]\n\n',
          'data: {"error":{"message":"boom"}}\n\n',
          'data: {broken\n\n',
          ': comment\n\n',
          'event: x\n',
          'data:',
          '\n\n\n',
          `data: ${'z'.repeat(5000)}`,
        ),
      ),
      { maxLength: 8 },
    ),
    label: fc.constant('random stream'),
  }),
);
