import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from './config.js';
import { openStore } from './app.js';
import { createKey } from './core/keys.js';
import { ORG_ID_PATTERN } from './core/model-spec.js';
import { serve } from './main.js';
import type { Store } from './store/store.js';

const USAGE = `Usage: switchyard <command>

  serve [--port N] [--host H]                    start the server (same as npm start)
  keys create --org ORG --name NAME [--admin]    create an API key (the organization too, if new)
  keys list [--org ORG]                          list keys (never their secrets)
  keys revoke KEY_ID                             revoke a key
  orgs create ORG [--name "Display name"]        create an organization
  orgs list                                      list organizations

The CLI works on the database directly, with the same configuration as the server
(SWITCHYARD_CONFIG, SWITCHYARD_DATA_DIR, DATABASE_URL). A running server sees a revocation made
here within SWITCHYARD_KEY_CACHE_TTL_MS (default 10 s); through the admin API it is immediate.`;

class UsageError extends Error {}

const iso = (s: number | null): string => (s === null ? '-' : new Date(s * 1000).toISOString().replace('.000', ''));

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n');
}

async function keysCommand(store: Store, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'create': {
      const { values } = parseArgs({ args, options: { org: { type: 'string' }, name: { type: 'string' }, admin: { type: 'boolean' } } });
      if (!values.org || !values.name) throw new UsageError('keys create needs --org and --name');
      if (!new RegExp(ORG_ID_PATTERN).test(values.org)) throw new UsageError(`--org must match ${ORG_ID_PATTERN}`);
      const created = await createKey(store, { org: values.org, name: values.name, role: values.admin ? 'admin' : 'inference' });
      if (created.orgCreated) console.log(`Created organization ${values.org}.`);
      console.log(`Created ${created.record.role} key ${created.record.id} (${values.name}) for ${values.org}.`);
      console.log('\nThe key is shown only this once; store it now:\n');
      console.log(`  ${created.key}\n`);
      return 0;
    }
    case 'list': {
      const { values } = parseArgs({ args, options: { org: { type: 'string' } } });
      const keys = await store.listKeys(values.org);
      if (keys.length === 0) {
        console.log('No keys.');
        return 0;
      }
      console.log(table([
        ['ID', 'ORG', 'NAME', 'ROLE', 'CREATED', 'REVOKED'],
        ...keys.map((k) => [k.id, k.org_id, k.name, k.role, iso(k.created_at), iso(k.revoked_at)]),
      ]));
      return 0;
    }
    case 'revoke': {
      const { positionals } = parseArgs({ args, allowPositionals: true });
      const id = positionals[0];
      if (!id) throw new UsageError('keys revoke needs a key id (see keys list)');
      if (!(await store.revokeKey(id, Math.floor(Date.now() / 1000)))) {
        console.error(`No key ${id}.`);
        return 1;
      }
      console.log(`Revoked key ${id}.`);
      return 0;
    }
    default:
      throw new UsageError(`unknown keys command '${sub ?? ''}'`);
  }
}

async function orgsCommand(store: Store, sub: string | undefined, args: string[]): Promise<number> {
  switch (sub) {
    case 'create': {
      const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { name: { type: 'string' } } });
      const id = positionals[0];
      if (!id || !new RegExp(ORG_ID_PATTERN).test(id)) throw new UsageError(`orgs create needs an id matching ${ORG_ID_PATTERN}`);
      if (await store.getOrg(id)) {
        console.error(`Organization ${id} already exists.`);
        return 1;
      }
      await store.createOrg({ id, name: values.name ?? id, created_at: Math.floor(Date.now() / 1000) });
      console.log(`Created organization ${id}.`);
      return 0;
    }
    case 'list': {
      const orgs = await store.listOrgs();
      console.log(table([['ID', 'NAME', 'CREATED'], ...orgs.map((o) => [o.id, o.name, iso(o.created_at)])]));
      return 0;
    }
    default:
      throw new UsageError(`unknown orgs command '${sub ?? ''}'`);
  }
}

export async function main(argv: string[]): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  if (cmd === undefined || cmd === 'help' || cmd === '--help' || cmd === '-h') {
    console.log(USAGE);
    return cmd === undefined ? 2 : 0;
  }
  if (cmd === 'serve') return serve(argv.slice(1));
  if (cmd !== 'keys' && cmd !== 'orgs') {
    console.error(`switchyard: unknown command '${cmd}'\n\n${USAGE}`);
    return 2;
  }
  let store: Store | undefined;
  try {
    const config = loadConfig();
    store = openStore(config);
    await store.migrate();
    return cmd === 'keys' ? await keysCommand(store, sub, rest) : await orgsCommand(store, sub, rest);
  } catch (err) {
    if (err instanceof UsageError || err instanceof ConfigError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`switchyard: ${(err as Error).message}\n\n${USAGE}`);
      return 2;
    }
    throw err;
  } finally {
    await store?.close();
  }
}
