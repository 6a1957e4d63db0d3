import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SHARED_MODELS, http, tempDir, type HttpResult, type WireList, type WireModel } from './helpers/server.js';
import { startProcess, type Running } from './helpers/process.js';
import { TINY, writeFixture } from '../bench/gguf-fixture.js';

const ADMIN = 'sk-test-admin-hostile-0123456789ab';

describe('hostile model files', () => {
  const models = tempDir();
  const dataDir = tempDir();
  let proc: Running | undefined;
  after(() => {
    proc?.child.kill('SIGKILL');
    rmSync(models, { recursive: true, force: true });
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('rejects truncated, mistyped and incomplete GGUFs at validation and keeps serving the good ones', async () => {
    copyFileSync(join(SHARED_MODELS, 'stories260K.gguf'), join(models, 'good.gguf'));
    // A well-formed llama-architecture file (random weights): the control that must load.
    writeFixture(join(models, 'control.gguf'), TINY);
    const bad: Record<string, Parameters<typeof writeFixture>[3]> = {
      // The case that aborts llama.cpp (and the whole process) if it is ever handed over.
      'no-feed-forward.gguf': { drop: ['llama.feed_forward_length'] },
      'ffn-as-string.gguf': { asString: ['llama.feed_forward_length'] },
      'zero-layers.gguf': { zero: ['llama.block_count'] },
      'no-architecture.gguf': { drop: ['general.architecture'] },
      'no-tokens.gguf': { drop: ['tokenizer.ggml.tokens'] },
      'unknown-tensor-type.gguf': { firstTensorType: 77 },
      'lying-tensor-count.gguf': { tensorCount: 2 ** 40 },
    };
    for (const [file, damage] of Object.entries(bad)) writeFixture(join(models, file), TINY, 42, damage);
    const whole = readFileSync(join(models, 'control.gguf'));
    writeFileSync(join(models, 'truncated-half.gguf'), whole.subarray(0, whole.length >> 1));
    writeFileSync(join(models, 'truncated-header.gguf'), whole.subarray(0, 300));
    writeFileSync(join(models, 'not-gguf.gguf'), 'GGUF but then nonsense');
    writeFileSync(join(models, 'empty.gguf'), '');

    proc = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_MODELS_DIR: models,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '1',
      SWITCHYARD_LOG_LEVEL: 'info',
    });
    const listed = await http<WireList<WireModel>>(proc.url, 'GET', '/v1/models?author=local', { key: ADMIN });
    assert.deepEqual(listed.json.data.map((m) => m.id).sort(), ['local/control', 'local/good']);
    const logs = proc.stdout();
    for (const file of [...Object.keys(bad), 'truncated-half.gguf', 'truncated-header.gguf', 'not-gguf.gguf', 'empty.gguf']) {
      assert.ok(
        logs.split('\n').some((l) => l.includes(`"file":"${file}"`) && l.includes('skipping invalid model file')),
        `${file} is reported as skipped`,
      );
    }
    assert.match(logs, /llama\.feed_forward_length is missing/);

    const url = proc.url;
    for (const model of ['local/good', 'local/control']) {
      const answer: HttpResult<unknown> = await http(url, 'POST', '/v1/chat/completions', {
        key: ADMIN,
        body: { model, messages: [{ role: 'user', content: 'Once' }], max_tokens: 4 },
      });
      assert.equal(answer.status, 200, `${model}: ${answer.text}`);
    }
    const missing = await http(proc.url, 'POST', '/v1/chat/completions', {
      key: ADMIN,
      body: { model: 'local/no-feed-forward', messages: [{ role: 'user', content: 'Once' }] },
    });
    assert.equal(missing.status, 404);
    assert.equal(proc.child.exitCode, null, 'the server is still up');
  });
});
