import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig, ConfigError } from '../src/config.js';
import { http, pgSchema, SHARED_MODELS, startServer, tempDir, type WireList, type WireModel } from './helpers/server.js';

const dir = tempDir();
after(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

describe('configuration', () => {
  it('has documented defaults', () => {
    const c = loadConfig({ env: {} });
    assert.equal(c.host, '127.0.0.1');
    assert.equal(c.port, 8080);
    assert.equal(c.dataDir, './data');
    assert.equal(c.modelsDir, './models');
    assert.equal(c.databaseUrl, undefined);
    assert.equal(c.authors.length, 12);
    assert.ok(
      c.authors.some((a) => a.includes('-')),
      'some author slugs are hyphenated',
    );
  });

  it('takes allow-list entries and origins in every documented form', () => {
    const c = loadConfig({
      env: {
        SWITCHYARD_UPSTREAM_ALLOW: '10.0.0.0/8, 192.168.1.7, fd00::/8, ::1, models.internal, vllm_1.lan, *',
        SWITCHYARD_CORS_ORIGIN: 'https://app.example.com,http://localhost:3000,chrome-extension://abcdefghijklmnop,tauri://localhost,null',
      },
    });
    assert.deepEqual(c.upstreamAllow, ['10.0.0.0/8', '192.168.1.7', 'fd00::/8', '::1', 'models.internal', 'vllm_1.lan', '*']);
    assert.equal(loadConfig({ env: { SWITCHYARD_CORS_ORIGIN: '*' } }).corsOrigin, '*');
  });

  it('lets env override the file, and flags override env', () => {
    const cfg = file('a.yaml', 'port: 9000\nhost: 0.0.0.0\n');
    assert.equal(loadConfig({ env: { SWITCHYARD_CONFIG: cfg } }).port, 9000);
    assert.equal(loadConfig({ env: { SWITCHYARD_CONFIG: cfg, PORT: '9100' } }).port, 9100);
    assert.equal(loadConfig({ env: { SWITCHYARD_CONFIG: cfg, PORT: '9100' }, overrides: { port: 9200 } }).port, 9200);
    const json = file('b.json', JSON.stringify({ dataDir: '/var/lib/sy', defaultCatalogue: false }));
    const c = loadConfig({ env: { SWITCHYARD_CONFIG: json } });
    assert.equal(c.dataDir, '/var/lib/sy');
    assert.deepEqual(c.models, []);
  });

  it('fails with a message naming the bad setting', () => {
    const cases: Array<[Record<string, string>, RegExp]> = [
      [{ PORT: 'eighty' }, /PORT/],
      [{ PORT: '70000' }, /PORT/],
      [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL/],
      // An enumerated setting lists what it takes.
      [
        { SWITCHYARD_LOG_LEVEL: 'loud' },
        /SWITCHYARD_LOG_LEVEL must be equal to one of the allowed values: fatal, error, warn, info, debug, trace, silent \(got "loud"\)/,
      ],
      [{ SWITCHYARD_CONFIG: file('bad-port.yaml', 'port: "x"\n') }, /bad-port\.yaml: port/],
      [{ SWITCHYARD_CONFIG: file('unknown.yaml', 'prot: 1\n') }, /unknown setting 'prot' in .*unknown\.yaml/],
      [{ SWITCHYARD_CONFIG: file('broken.yaml', 'port: [\n') }, /not valid YAML/],
      [{ SWITCHYARD_CONFIG: file('broken.json', '{"port":') }, /not valid JSON/],
      [{ SWITCHYARD_CONFIG: join(dir, 'missing.yaml') }, /cannot read/],
      [{ SWITCHYARD_CONFIG: file('bad-model.yaml', 'models:\n  - id: nobody/x\n    context_length: 5\n') }, /author 'nobody'/],
      [
        {
          SWITCHYARD_CONFIG: file(
            'bad-price.yaml',
            'models:\n  - id: qwen/x\n    context_length: 5\n    pricing: [{metric: input_tokens, rate: -2}]\n',
          ),
        },
        /bad-price\.yaml: models \(at 0\.pricing\.0\.rate\) must be >= 0/,
      ],
      // An allow-list entry is an address, a CIDR block or a host name, never read as something
      // wider: `10.0.0.0/` was once `10.0.0.0/0`, every IPv4 address.
      [{ SWITCHYARD_UPSTREAM_ALLOW: '10.0.0.0/' }, /SWITCHYARD_UPSTREAM_ALLOW: '10\.0\.0\.0\/': the prefix length/],
      [{ SWITCHYARD_UPSTREAM_ALLOW: '10.0.0.0/99' }, /SWITCHYARD_UPSTREAM_ALLOW: .*from 0 to 32/],
      [{ SWITCHYARD_UPSTREAM_ALLOW: 'fd00::/200' }, /SWITCHYARD_UPSTREAM_ALLOW: .*from 0 to 128/],
      [{ SWITCHYARD_UPSTREAM_ALLOW: 'models.internal,999.0.0.0/8' }, /'999\.0\.0\.0' is not an IP address/],
      [{ SWITCHYARD_UPSTREAM_ALLOW: 'http://x' }, /SWITCHYARD_UPSTREAM_ALLOW/],
      [{ SWITCHYARD_CORS_ORIGIN: 'not-an-origin' }, /SWITCHYARD_CORS_ORIGIN: 'not-an-origin' is not an origin/],
      [{ SWITCHYARD_CORS_ORIGIN: 'https://app.example.com/' }, /SWITCHYARD_CORS_ORIGIN/],
      [{ SWITCHYARD_CORS_ORIGIN: 'https://App.example.com:443' }, /written as browsers send it: 'https:\/\/app\.example\.com'/],
      [{ SWITCHYARD_CORS_ORIGIN: 'https://app.example.com,*' }, /'\*' allows every origin and stands alone/],
    ];
    for (const [env, pattern] of cases) {
      assert.throws(
        () => loadConfig({ env }),
        (err: unknown) => {
          assert.ok(err instanceof ConfigError, String(err));
          assert.match(err.message, pattern);
          return true;
        },
        JSON.stringify(env),
      );
    }
  });

  it('loads config-file models into the catalogue, replacing a shipped entry of the same id', async () => {
    const server = await startServer({
      configFile: {
        name: 'switchyard.yaml',
        text: [
          'models:',
          '  - id: meta-llama/llama-3.1-8b-instruct',
          '    name: Our Llama',
          '    context_length: 8192',
          '  - id: qwen/house-model',
          '    description: In-house',
          '    context_length: 2048',
          'localModels:',
          '  stories260K.gguf:',
          '    id: meta-llama/tiny-stories',
          '    name: Tiny Stories',
          '    pricing: [{ metric: input_tokens, rate: 1 }, { metric: output_tokens, rate: 2 }]',
        ].join('\n'),
      },
    });
    try {
      const get = (id: string) => http<WireModel>(server.url, 'GET', `/v1/models/${id}`, { key: server.adminKey });
      const llama = await get('meta-llama/llama-3.1-8b-instruct');
      assert.equal(llama.json.name, 'Our Llama');
      assert.equal(llama.json.context_length, 8192);
      assert.equal((await get('qwen/house-model')).json.description, 'In-house');
      const named = await get('meta-llama/tiny-stories');
      assert.equal(named.status, 200);
      assert.equal(named.json.name, 'Tiny Stories');
      assert.equal(named.json.context_length, 512);
      assert.equal((await get('local/stories260k')).status, 404, 'a named local model is not also listed under its default id');
    } finally {
      await server.close();
    }
  });

  it('skips invalid GGUF files and keeps serving the valid ones', async () => {
    const models = tempDir();
    copyFileSync(join(SHARED_MODELS, 'stories260K.gguf'), join(models, 'good.gguf'));
    writeFileSync(join(models, 'garbage.gguf'), 'this is not a model');
    const head = Buffer.alloc(4000);
    const { openSync, readSync, closeSync } = await import('node:fs');
    const fd = openSync(join(SHARED_MODELS, 'stories260K.gguf'), 'r');
    readSync(fd, head, 0, head.length, 0);
    closeSync(fd);
    writeFileSync(join(models, 'truncated.gguf'), head);
    const server = await startServer({ modelsDir: models });
    try {
      const res = await http<WireList<WireModel>>(server.url, 'GET', '/v1/models?author=local', { key: server.adminKey });
      assert.deepEqual(
        res.json.data.map((m) => m.id),
        ['local/good'],
      );
    } finally {
      await server.close();
      rmSync(models, { recursive: true, force: true });
    }
  });

  it('serves the same catalogue from PostgreSQL when DATABASE_URL says so', async () => {
    const schema = await pgSchema();
    const server = await startServer({ env: { DATABASE_URL: schema.url } });
    try {
      const ready = await http<{ database: string }>(server.url, 'GET', '/readyz');
      assert.equal(ready.json.database, 'postgres');
      const created = await http(server.url, 'POST', '/admin/models', {
        key: server.adminKey,
        body: { id: 'qwen/pg-model', context_length: 1000, visibility: 'private', owned_by: 'acme' },
      });
      assert.equal(created.status, 201, created.text);
      const res = await http<WireModel>(server.url, 'GET', '/v1/models/qwen%2Fpg-model', { key: server.adminKey });
      assert.equal(res.json.owned_by, 'acme');
    } finally {
      await server.close();
      await schema.drop();
    }
  });
});
