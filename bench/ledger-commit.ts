/**
 * `node dist/bench/ledger-commit.js [--records N]`: what one usage-ledger commit costs on the event
 * loop, through the store's own path (`KyselyStore.insertUsage`, real migrations, WAL), one record
 * per commit (requests one at a time) and 16 per commit (the group commit under load); and the same
 * with `usage_records` rebuilt as a WITHOUT ROWID table (one b-tree fewer per record), which was
 * considered to cut the WAL frames of a commit. Prints µs per record, medians of three rounds that
 * alternate which table goes first. Asserts nothing.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import SqliteDatabase from 'better-sqlite3';
import { KyselyStore } from '../src/store/kysely-store.js';
import { newUsageId } from '../src/core/ledger.js';
import type { UsageRecord } from '../src/store/store.js';
import { median } from './lib.js';

const { values } = parseArgs({ options: { records: { type: 'string', default: '4000' } } });
const records = Number(values.records);

let n = 0;
function record(): UsageRecord {
  n++;
  const at = Date.now();
  return {
    id: newUsageId(),
    at,
    day: new Date(at).toISOString().slice(0, 10),
    request_id: `req_${n.toString(16).padStart(32, '0')}`,
    key_id: 'key_bench',
    org_id: 'org_bench',
    model: 'openai/bench-fake',
    deployment: 'dep_bench',
    endpoint: 'chat.completions',
    stream: false,
    input_tokens: 12,
    cached_tokens: 0,
    output_tokens: 20,
    reasoning_tokens: 0,
    cost: 0.0000138,
    price_missing: false,
    estimated: false,
    latency_ms: 3,
    ttft_ms: 2,
    status: 200,
    error_code: null,
  };
}

/** A migrated store in a folder of its own; `withoutRowid` rebuilds the ledger table (and its indexes) that way. */
async function open(withoutRowid: boolean): Promise<{ store: KyselyStore; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'switchyard-ledger-bench-'));
  const file = join(dir, 'switchyard.db');
  const store = new KyselyStore({ sqlitePath: file });
  await store.migrate();
  if (withoutRowid) {
    const db = new SqliteDatabase(file);
    const table = db.prepare("select sql from sqlite_master where type = 'table' and name = 'usage_records'").pluck().get() as string;
    const indexes = db
      .prepare("select sql from sqlite_master where type = 'index' and tbl_name = 'usage_records' and sql is not null")
      .pluck()
      .all() as string[];
    db.exec(`drop table usage_records; ${table} without rowid; ${indexes.join('; ')}`);
    const rebuilt = db.prepare("select sql from sqlite_master where type = 'table' and name = 'usage_records'").pluck().get() as string;
    if (!/without rowid$/i.test(rebuilt) || indexes.length < 2) throw new Error(`the ledger table was not rebuilt: ${rebuilt}`);
    db.close();
  }
  return { store, dir };
}

async function perRecord(store: KyselyStore, batch: number): Promise<number> {
  const commits = Math.ceil(records / batch);
  const started = process.hrtime.bigint();
  for (let i = 0; i < commits; i++) await store.insertUsage(Array.from({ length: batch }, record));
  return Number(process.hrtime.bigint() - started) / 1000 / (commits * batch);
}

const subjects = { rowid: await open(false), 'without rowid': await open(true) };
const results = new Map<string, number[]>();
try {
  // A warm-up, so that both tables have pages to insert among.
  for (const s of Object.values(subjects)) await perRecord(s.store, 16);
  for (let round = 0; round < 3; round++) {
    const names = Object.keys(subjects) as Array<keyof typeof subjects>;
    for (const name of round % 2 === 0 ? names : names.reverse()) {
      for (const batch of [1, 16]) {
        const key = `${name}, ${batch} per commit`;
        results.set(key, [...(results.get(key) ?? []), await perRecord(subjects[name].store, batch)]);
      }
    }
  }
} finally {
  for (const s of Object.values(subjects)) {
    await s.store.close();
    rmSync(s.dir, { recursive: true, force: true });
  }
}
for (const [key, xs] of results) console.log(`${key}: ${median(xs).toFixed(1)} µs per record (${xs.map((x) => x.toFixed(1)).join(', ')})`);
