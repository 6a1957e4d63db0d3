import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { Client } from 'undici';
import { http, tempDir, type WireKey } from './helpers/server.js';
import { startProcess } from './helpers/process.js';
import { eventually } from './helpers/wait.js';

const ADMIN = 'sk-test-cluster-admin-0123456789';

interface UsageRow {
  group: string;
  requests: number;
  output_tokens: number;
}

describe('SWITCHYARD_WORKERS: several worker processes on one port', () => {
  const dataDir = tempDir();
  after(() => rmSync(dataDir, { recursive: true, force: true }));

  it('shares rate limits across workers and records every request once', async () => {
    const p = await startProcess({
      SWITCHYARD_DATA_DIR: dataDir,
      SWITCHYARD_ADMIN_KEY: ADMIN,
      SWITCHYARD_WORKERS: '2',
      SWITCHYARD_LEDGER_FLUSH_MS: '20',
    });
    try {
      // The primary announces the service once both workers listen.
      assert.match(p.stdout(), /"workers":2,"msg":"switchyard listening"/);
      // Each worker's own line may reach stdout just after the primary's (two processes writing).
      await eventually(() => assert.equal(p.stdout().match(/"worker":\d,"address".*"msg":"switchyard listening"/g)?.length, 2, p.stdout()));
      const created = await http<WireKey>(p.url, 'POST', '/admin/keys', {
        key: ADMIN,
        body: { org: 'acme', name: 'limited', limits: { rpm: 4 } },
      });
      assert.equal(created.status, 201, created.text);

      // Each request on a new connection: the primary hands connections to the workers in turn, so
      // without shared counters each worker would allow 4.
      const statuses: number[] = [];
      for (let i = 0; i < 8; i++) {
        const client = new Client(p.url);
        const res = await client.request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { authorization: `Bearer ${created.json.key!}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'local/stories260k', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 3 }),
        });
        await res.body.text();
        statuses.push(res.statusCode);
        await client.close();
      }
      assert.deepEqual(statuses.filter((s) => s === 200).length, 4, `statuses ${statuses.join(',')}`);
      assert.deepEqual(statuses.filter((s) => s === 429).length, 4, `statuses ${statuses.join(',')}`);

      // Every worker writes its own usage records to the shared database.
      const usage = await eventually(async () => {
        const u = await http<{ data: UsageRow[] }>(p.url, 'GET', `/admin/usage?group_by=key&key=${created.json.id}`, { key: ADMIN });
        assert.equal(u.status, 200, u.text);
        assert.equal(u.json.data[0]?.requests, 4);
        return u;
      });
      assert.equal(usage.json.data[0]?.output_tokens, 12);
    } finally {
      p.child.kill('SIGTERM');
    }
    assert.equal(await p.exited, 0, p.stdout());
    assert.match(p.stdout(), /"msg":"shut down cleanly"}\s*$/);
  });
});
