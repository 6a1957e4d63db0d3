/**
 * The reference pass-through again, on Fastify instead of bare node:http (its JSON body parser, its
 * router, one onRequest hook setting a header, the reply streamed by Fastify): what Fastify alone
 * costs per request, to tell its share of Switchyard's cost from the rest (bench/layers.ts).
 * `node dist/bench/fastify-proxy.js <port> <upstream origin>`
 */
import Fastify from 'fastify';
import { Pool } from 'undici';

const upstream = new Pool(process.argv[3] ?? 'http://127.0.0.1:1', { connections: null, keepAliveTimeout: 60_000 });
const app = Fastify({ logger: false, keepAliveTimeout: 60_000 });
app.addHook('onRequest', (req, reply, done) => {
  reply.header('x-request-id', req.id);
  done();
});
app.post('/v1/chat/completions', async (req, reply) => {
  const up = await upstream.request({
    path: '/v1/chat/completions',
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(req.body),
  });
  reply.code(up.statusCode).header('content-type', String(up.headers['content-type'] ?? 'application/json'));
  return reply.send(up.body);
});
await app.listen({ port: Number(process.argv[2] ?? 0), host: '127.0.0.1' });
const address = app.server.address();
process.stdout.write(`ready ${typeof address === 'object' && address ? address.port : ''}\n`);
process.on('SIGTERM', () => process.exit(0));
