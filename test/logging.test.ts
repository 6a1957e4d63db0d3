import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import pino from 'pino';
import { accessLog } from '../src/http/access-log.js';
import { LogBlocks } from '../src/log-destination.js';
import { RequestLogger } from '../src/http/request-logger.js';
import { createLogger } from '../src/app.js';
import { loadConfig } from '../src/config.js';

/** A pino logger whose lines are collected, with a fixed time so that two lines can be compared byte for byte. */
function capture(opts: pino.LoggerOptions = {}): { log: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const log = pino(
    { base: { service: 'switchyard' }, timestamp: () => ',"time":1700000000123', ...opts },
    { write: (line: string) => void lines.push(line) },
  );
  return { log, lines };
}

/** Strings with what JSON escapes (quotes, backslashes, control characters, lone surrogates) and what it does not. */
const text = fc.string({
  unit: fc.constantFrom(
    'a',
    'Z',
    '0',
    '/',
    '?',
    '=',
    '&',
    '%',
    ' ',
    '"',
    '\\',
    '\n',
    '\t',
    '\u0000',
    '\u001f',
    '\u007f',
    'é',
    '\u00ff',
    '€',
    '\ud800',
    '\udc00',
  ),
  maxLength: 60,
});

describe('access log', () => {
  it("writes, on a plain logger, the line pino's child logger writes for the same request, byte for byte", () => {
    fc.assert(
      fc.property(text, text, text, fc.integer({ min: 100, max: 599 }), fc.nat(), (id, method, url, status, ms) => {
        const ours = capture();
        const theirs = capture();
        const line = accessLog(ours.log);
        assert.ok(line.direct);
        line(id, method, url, status, ms);
        theirs.log.child({ request_id: id }).info({ method, url, status, ms }, 'request');
        assert.equal(ours.lines.length, 1);
        assert.deepEqual(JSON.parse(ours.lines[0]!), JSON.parse(theirs.lines[0]!));
        // Byte for byte wherever pino's own escaping agrees with JSON.stringify's (it leaves a lone
        // surrogate in a short string as it is, where JSON.stringify writes \ud800).
        if (!/[\ud800-\udfff]/.test(id + method + url)) assert.equal(ours.lines[0], theirs.lines[0]);
      }),
    );
  });

  it('writes nothing below its level, and goes through info() on a logger that is not plain', () => {
    const quiet = capture({ level: 'warn' });
    accessLog(quiet.log)('req_1', 'POST', '/v1/chat/completions', 200, 3);
    assert.deepEqual(quiet.lines, []);

    // What changes pino's line makes a logger not plain: the same line as pino's either way.
    for (const opts of [
      { redact: ['url', 'request_id'] },
      { crlf: true },
      { serializers: { msg: (m: string) => m.toUpperCase() } },
      { serializers: { url: () => '/hidden' } },
      { formatters: { log: (o: Record<string, unknown>) => ({ ...o, extra: 1 }) } },
      { messageKey: 'message' },
      { msgPrefix: '[api] ' },
      { nestedKey: 'payload' },
      { formatters: { level: (label: string) => ({ level: label }) } },
      { hooks: { streamWrite: (l: string) => l.replace('request', 'REQUEST') } },
    ] satisfies pino.LoggerOptions[]) {
      const ours = capture(opts);
      const theirs = capture(opts);
      const line = accessLog(ours.log);
      assert.equal(line.direct, false, JSON.stringify(Object.keys(opts)));
      line('req_o', 'POST', '/v1/chat/completions', 200, 2);
      theirs.log.child({ request_id: 'req_o' }).info({ method: 'POST', url: '/v1/chat/completions', status: 200, ms: 2 }, 'request');
      assert.equal(ours.lines[0], theirs.lines[0], JSON.stringify(Object.keys(opts)));
    }

    const mixed = capture({ mixin: () => ({ region: 'eu' }) });
    const line = accessLog(mixed.log);
    assert.equal(line.direct, false);
    line('req_2', 'GET', '/v1/models', 200, 1);
    assert.deepEqual(JSON.parse(mixed.lines[0]!), {
      level: 30,
      time: 1700000000123,
      service: 'switchyard',
      region: 'eu',
      request_id: 'req_2',
      method: 'GET',
      url: '/v1/models',
      status: 200,
      ms: 1,
      msg: 'request',
    });
  });

  it("is written directly on the server's own logger", () => {
    for (const logBufferBytes of [0, 4096]) {
      const log = createLogger({ ...loadConfig({ env: {} }), logBufferBytes, logLevel: 'silent' });
      assert.ok(accessLog(log).direct, `logBufferBytes ${logBufferBytes}`);
    }
  });

  it('gives a destination that asks for metadata what pino gives it, and LogBlocks writes warnings and errors at once', () => {
    const seen: Array<Record<string, unknown>> = [];
    const meta = {
      [Symbol.for('pino.metadata')]: true,
      write(this: Record<string, unknown>) {
        seen.push({ level: this['lastLevel'], msg: this['lastMsg'], obj: this['lastObj'], time: this['lastTime'] });
      },
    };
    const log = pino({ timestamp: () => ',"time":1700000000123' }, meta as unknown as pino.DestinationStream);
    const line = accessLog(log);
    assert.ok(line.direct);
    line('req_m', 'POST', '/v1/responses', 201, 7);
    log.child({ request_id: 'req_m' }).info({ method: 'POST', url: '/v1/responses', status: 201, ms: 7 }, 'request');
    assert.equal(seen.length, 2);
    assert.deepEqual(seen[0], seen[1]);
    assert.deepEqual(seen[1]!['level'], 30);
    assert.deepEqual(seen[1]!['time'], '1700000000123');

    const written: string[] = [];
    const out = { write: (block: string) => void written.push(block), flushSync: () => undefined } as unknown as ConstructorParameters<
      typeof LogBlocks
    >[0];
    const blocks = new LogBlocks(out, 1 << 20, 60_000);
    const blockLog = pino({ base: null, timestamp: false, level: 'trace' }, blocks);
    blockLog.trace('t');
    blockLog.debug('d');
    blockLog.info('i');
    accessLog(blockLog)('req_b', 'GET', '/v1/models', 200, 1);
    assert.deepEqual(written, []);
    for (const level of ['warn', 'error', 'fatal'] as const) {
      blockLog[level](level);
      assert.equal(written.length, 1, level);
      assert.match(written.pop()!, new RegExp(`"msg":"${level}"}\n$`));
    }
    blockLog.info('i');
    blocks.flush();
    assert.deepEqual(written, ['{"level":30,"msg":"i"}\n']);
  });

  it("request logger: writes what pino's child writes, and makes the child only when something is logged", () => {
    const ours = capture({ level: 'debug' });
    const theirs = capture({ level: 'debug' });
    let made = 0;
    const parent = Object.assign(Object.create(ours.log) as pino.Logger, {
      child(this: pino.Logger, bindings: pino.Bindings, options?: pino.ChildLoggerOptions) {
        made++;
        return ours.log.child(bindings, options);
      },
    });
    const log = new RequestLogger(parent, { request_id: 'req_lazy' }, {});
    assert.equal(log.level, 'debug');
    log.trace('below the level');
    log.silent('never');
    assert.equal(made, 0, 'a call below the level makes no child');
    const child = theirs.log.child({ request_id: 'req_lazy' });
    for (const [method, args] of [
      ['info', [{ a: 1 }, 'with %s', 'format']],
      ['warn', ['plain']],
      ['error', [new Error('boom')]],
      ['debug', [{ b: 'x' }]],
      ['fatal', [{ c: null }, 'fatal']],
    ] as const) {
      (log[method] as (...a: unknown[]) => void)(...args);
      (child[method] as (...a: unknown[]) => void)(...args);
    }
    assert.equal(made, 1, 'the first call at the level made the child, once');
    assert.equal(ours.lines.length, 5);
    // The error's stack names this file's lines, where the two calls differ: compared without it.
    const strip = (l: string) => l.replace(/"stack":"[^"]*"/, '"stack":""');
    assert.deepEqual(ours.lines.map(strip), theirs.lines.map(strip));
    const grandchild = log.child({ step: 2 });
    grandchild.info('deeper');
    assert.match(ours.lines.at(-1)!, /"request_id":"req_lazy","step":2,"msg":"deeper"/);
    log.level = 'error';
    assert.equal(log.level, 'error');
    log.info('quiet now');
    assert.equal(ours.lines.length, 6);

    const untouched = new RequestLogger(parent, { request_id: 'req_quiet' }, { level: 'warn' });
    assert.equal(untouched.level, 'warn');
    assert.equal(made, 1, 'reading the level makes no child');
  });
});
