import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createKey, http, startServer, type WireList } from './helpers/server.js';

interface Loaded {
  model: string | null;
  bytes: number;
  active: number;
}

const ask = (model: string) => ({
  model,
  messages: [{ role: 'user' as const, content: 'Once upon a time' }],
  max_tokens: 5,
  temperature: 0,
});

describe('local models', () => {
  it('loads on first use and unloads the least recently used model past the memory budget', async () => {
    // A 1 MiB budget holds no model at all: each load must evict the idle one before it.
    const server = await startServer({ env: { SWITCHYARD_LOCAL_MEMORY_MB: '1' } });
    try {
      const loaded = async () =>
        (await http<WireList<Loaded>>(server.url, 'GET', '/admin/local/loaded', { key: server.adminKey })).json.data.map((l) => l.model);
      const client = new OpenAI({ apiKey: server.adminKey, baseURL: server.baseURL, maxRetries: 0 });
      assert.deepEqual(await loaded(), [], 'nothing is loaded before first use');
      await client.chat.completions.create(ask('local/stories260k'));
      assert.deepEqual(await loaded(), ['local/stories260k']);
      await client.chat.completions.create(ask('local/llama-2-tiny-random'));
      assert.deepEqual(await loaded(), ['local/llama-2-tiny-random'], 'the idle model was unloaded');
      const again = await client.chat.completions.create(ask('local/stories260k'));
      assert.match(again.choices[0]!.message.content ?? '', /there/);
      assert.deepEqual(await loaded(), ['local/stories260k']);
    } finally {
      await server.close();
    }
  });

  it('keeps several models loaded within the budget, and preloads at start when asked', async () => {
    const server = await startServer({ env: { SWITCHYARD_LOCAL_PRELOAD: 'true' } });
    try {
      const res = await http<WireList<Loaded>>(server.url, 'GET', '/admin/local/loaded', { key: server.adminKey });
      assert.deepEqual(res.json.data.map((l) => l.model).sort(), ['local/llama-2-tiny-random', 'local/stories260k']);
      assert.ok(res.json.data.every((l) => l.bytes > 0 && l.active === 0));
      const key = (await createKey(server, 'acme')).key;
      assert.equal((await http(server.url, 'GET', '/admin/local/loaded', { key })).status, 403);
    } finally {
      await server.close();
    }
  });

  it('renders a configured chat template instead of the plain-text fallback', async () => {
    const template =
      "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
    const server = await startServer({
      configFile: { name: 't.json', text: JSON.stringify({ localModels: { 'stories260K.gguf': { chatTemplate: template } } }) },
    });
    const plain = await startServer();
    try {
      const messages = [
        { role: 'system' as const, content: 'Be brief.' },
        { role: 'user' as const, content: 'Once upon a time' },
      ];
      const withTemplate = await new OpenAI({ apiKey: server.adminKey, baseURL: server.baseURL, maxRetries: 0 }).chat.completions.create({
        model: 'local/stories260k',
        messages,
        max_tokens: 5,
        temperature: 0,
      });
      const withoutTemplate = await new OpenAI({ apiKey: plain.adminKey, baseURL: plain.baseURL, maxRetries: 0 }).chat.completions.create({
        model: 'local/stories260k',
        messages,
        max_tokens: 5,
        temperature: 0,
      });
      // The role markers and newlines of the template are extra prompt tokens.
      assert.ok(
        withTemplate.usage!.prompt_tokens > withoutTemplate.usage!.prompt_tokens + 6,
        `${withTemplate.usage!.prompt_tokens} vs ${withoutTemplate.usage!.prompt_tokens}`,
      );
      assert.equal(withTemplate.usage!.completion_tokens, 5);
    } finally {
      await server.close();
      await plain.close();
    }
  });

  it('answers generation on inactive, pending and private models as decided', async () => {
    const server = await startServer();
    try {
      const mk = (body: object) => http(server.url, 'POST', '/admin/models', { key: server.adminKey, body });
      await mk({ id: 'qwen/off', status: 'inactive', context_length: 100 });
      await mk({ id: 'qwen/soon', status: 'pending', context_length: 100 });
      await mk({ id: 'qwen/acme-only', visibility: 'private', owned_by: 'acme', context_length: 100 });
      const key = (await createKey(server, 'globex')).key;
      const chat = (model: string) =>
        http(server.url, 'POST', '/v1/chat/completions', { key, body: { model, messages: [{ role: 'user', content: 'hi' }] } });
      const off = await chat('qwen/off');
      assert.equal(off.status, 400);
      assert.equal(off.json.error.code, 'model_inactive');
      const soon = await chat('qwen/soon');
      assert.equal(soon.status, 503);
      assert.equal(soon.json.error.code, 'model_not_ready');
      assert.ok(soon.headers['retry-after']);
      const hidden = await chat('qwen/acme-only');
      assert.equal(hidden.status, 404);
      assert.equal(hidden.json.error.code, 'model_not_found');
    } finally {
      await server.close();
    }
  });
});
