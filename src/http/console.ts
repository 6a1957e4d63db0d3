import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, extname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { App } from '../api/context.js';

/**
 * The web console: static files built from console/ (by scripts/build-console.ts, part of `npm run
 * build`) into dist/console, served under /console by the same process. Nothing here reads data:
 * the console calls the public and admin HTTP API with the key its user signs in with, like any
 * other client. Same origin, so CORS stays as configured (closed by default).
 */
const CONSOLE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', 'console');

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.json': 'application/json; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
};

/** Only this origin: no CDN, no external font, no inline script or style sheet, never framed. */
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; font-src 'self'; " +
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
};

/** Built assets carry a content hash in their name (`main-3HX7QK2A.js`): cached for good. */
const HASHED = /^assets\/.+-[A-Z0-9]{8}\.[a-z0-9]+$/;

interface StaticFile {
  body: Buffer;
  gzip: Buffer | undefined;
  type: string;
  cache: string;
}

function load(dir: string): Map<string, StaticFile> {
  const files = new Map<string, StaticFile>();
  if (!existsSync(dir)) return files;
  const walk = (d: string): void => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      if (statSync(path).isDirectory()) {
        walk(path);
        continue;
      }
      const rel = relative(dir, path).split(sep).join('/');
      const body = readFileSync(path);
      const type = TYPES[extname(name)] ?? 'application/octet-stream';
      const compressible = type.startsWith('text/') || type.startsWith('application/json') || type === 'image/svg+xml';
      const gzip = compressible && body.length > 1024 ? gzipSync(body) : undefined;
      files.set(rel, { body, gzip, type, cache: HASHED.test(rel) ? 'public, max-age=31536000, immutable' : 'no-cache' });
    }
  };
  walk(dir);
  return files;
}

function send(req: FastifyRequest, reply: FastifyReply, file: StaticFile): FastifyReply {
  reply.headers(SECURITY_HEADERS).header('content-type', file.type).header('cache-control', file.cache);
  if (file.gzip) {
    reply.header('vary', 'accept-encoding');
    const accepts = req.headers['accept-encoding'];
    if (typeof accepts === 'string' && /\bgzip\b/.test(accepts)) return reply.header('content-encoding', 'gzip').send(file.gzip);
  }
  return reply.send(file.body);
}

/** GET /console (and every path under it, for the single-page app's own routes) and its assets. */
export function registerConsole(app: App, dir = CONSOLE_DIR): void {
  const files = load(dir);
  const index = files.get('index.html');
  const serveIndex = (req: FastifyRequest, reply: FastifyReply): FastifyReply => {
    if (!index) {
      return reply
        .code(404)
        .headers(SECURITY_HEADERS)
        .type('text/plain; charset=utf-8')
        .send('The console is not built: run `npm run build` (npm ci does it).\n');
    }
    return send(req, reply, index);
  };
  const hidden = { schema: { hide: true } };
  app.get('/console', hidden, serveIndex);
  app.get<{ Params: { '*': string } }>('/console/*', hidden, (req, reply) => {
    const path = req.params['*'];
    const file = files.get(path);
    if (file) return send(req, reply, file);
    // A missing file is a 404; any other path is one of the app's pages.
    if (path.startsWith('assets/') || extname(path) !== '') {
      reply.callNotFound();
      return reply;
    }
    return serveIndex(req, reply);
  });
}
