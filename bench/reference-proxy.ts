/**
 * The reference: the least a Node gateway can do. A `node:http` server that parses the request JSON,
 * sends it on through an undici Pool and streams the answer back. Its throughput is the Node limit
 * Switchyard is measured against. `node dist/bench/reference-proxy.js <port> <upstream origin>`
 */
import { createServer } from 'node:http';
import { Pool } from 'undici';

const upstream = new Pool(process.argv[3] ?? 'http://127.0.0.1:1', { connections: null, keepAliveTimeout: 60_000 });

const server = createServer((req, res) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    let body: unknown;
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      res.writeHead(400).end();
      return;
    }
    upstream
      .request({
        path: '/v1/chat/completions',
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      })
      .then(
        (up) => {
          res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? 'application/json') });
          up.body.pipe(res);
          res.on('close', () => up.body.destroy());
        },
        () => res.writeHead(502).end(),
      );
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`ready ${typeof address === 'object' && address ? address.port : ''}\n`);
});
process.on('SIGTERM', () => process.exit(0));
