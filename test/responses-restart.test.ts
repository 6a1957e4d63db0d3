import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { PACKAGE_ROOT } from '../src/config.js';
import { createKey, http, SHARED_MODELS, startServer, tempDir } from './helpers/server.js';
import type { WireResponse } from './helpers/responses.js';
import { eventually } from './helpers/wait.js';

describe('stored responses across restarts', () => {
  const dataDir = tempDir();
  const adminKey = 'restart-test-admin-key-0001';
  after(() => rmSync(dataDir, { recursive: true, force: true }));

  it('keeps responses, conversations and keys across a restart', async () => {
    const first = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey } });
    const key = (await createKey(first, 'acme')).key;
    const c1 = new OpenAI({ apiKey: key, baseURL: first.baseURL, maxRetries: 0 });
    const conv = await c1.conversations.create({});
    const r = await c1.responses.create({
      model: 'local/stories260k',
      input: 'Once upon a time',
      conversation: conv.id,
      max_output_tokens: 8,
      temperature: 0,
    });
    await first.close();

    const second = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey } });
    try {
      const c2 = new OpenAI({ apiKey: key, baseURL: second.baseURL, maxRetries: 0 });
      const again = await c2.responses.retrieve(r.id);
      assert.deepEqual(again.output, r.output);
      assert.equal(again.output_text, r.output_text);
      assert.equal(again.status, 'incomplete');
      const items = await c2.conversations.items.list(conv.id, { order: 'asc' });
      assert.equal(items.data.length, 2);
      const next = await c2.responses.create({
        model: 'local/stories260k',
        previous_response_id: r.id,
        input: 'The end.',
        max_output_tokens: 2,
      });
      assert.equal(next.previous_response_id, r.id);
    } finally {
      await second.close();
    }
  });

  it('marks a response that was running when the process died as failed', async () => {
    const child = spawn(process.execPath, [join(PACKAGE_ROOT, 'dist', 'src', 'main.js'), '--port', '0'], {
      env: {
        PATH: process.env['PATH'] ?? '',
        SWITCHYARD_DATA_DIR: dataDir,
        SWITCHYARD_MODELS_DIR: SHARED_MODELS,
        SWITCHYARD_ADMIN_KEY: adminKey,
      },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    const url = await new Promise<string>((res, rej) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /"address":"(http:\/\/[^"]+)"/.exec(out);
        if (m) res(m[1]!);
      });
      child.on('exit', (code) => rej(new Error(`exited ${code}: ${out}`)));
    });
    const exited = new Promise((r) => child.on('exit', r));
    const started = await http<WireResponse>(url, 'POST', '/v1/responses', {
      key: adminKey,
      body: { model: 'local/llama-2-tiny-random', input: 'hello', max_output_tokens: 4000, background: true },
    });
    assert.equal(started.status, 200, started.text);
    const id = started.json.id;
    // Killed while it is generating.
    await eventually(async () =>
      assert.equal((await http<WireResponse>(url, 'GET', `/v1/responses/${id}`, { key: adminKey })).json.status, 'in_progress'),
    );
    child.kill('SIGKILL');
    await exited;

    const restarted = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey } });
    try {
      const res = await http<WireResponse>(restarted.url, 'GET', `/v1/responses/${id}`, { key: adminKey });
      assert.equal(res.json.status, 'failed', 'not left in_progress forever');
      assert.equal(res.json.error?.code, 'server_error');
    } finally {
      await restarted.close();
    }
  });

  it('lets background work finish on a graceful shutdown, as foreground work does', async () => {
    // (What is still running at the shutdown timeout is failed: test/process.test.ts.)
    const s = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey } });
    const r = await http<WireResponse>(s.url, 'POST', '/v1/responses', {
      key: adminKey,
      body: { model: 'local/llama-2-tiny-random', input: 'hello', max_output_tokens: 40, background: true },
    });
    await s.close();
    const again = await startServer({ dataDir, env: { SWITCHYARD_ADMIN_KEY: adminKey } });
    try {
      const res = await http<WireResponse>(again.url, 'GET', `/v1/responses/${r.json.id}`, { key: adminKey });
      assert.equal(res.json.status, 'incomplete', 'it ran to its max_output_tokens');
      assert.equal((res.json as unknown as { usage: { output_tokens: number } }).usage.output_tokens, 40);
    } finally {
      await again.close();
    }
  });
});
