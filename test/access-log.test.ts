import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import pino from 'pino';
import { accessLog } from '../src/http/access-log.js';
import { LogBlocks, warnOrWorse } from '../src/log-destination.js';
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

  it('tells warnings, errors and fatal lines from the rest, as LogBlocks writes them at once', () => {
    const { log, lines } = capture({ level: 'trace' });
    log.trace('t');
    log.debug('d');
    log.info('i');
    log.warn('w');
    log.error('e');
    log.fatal('f');
    assert.deepEqual(
      lines.map((l) => warnOrWorse(l)),
      [false, false, false, true, true, true],
    );
    assert.equal(warnOrWorse('{"level":4'), false);
    assert.equal(warnOrWorse('{"level":400,"time":1}'), false);

    const written: string[] = [];
    const out = { write: (block: string) => void written.push(block), flushSync: () => undefined } as unknown as ConstructorParameters<
      typeof LogBlocks
    >[0];
    const blocks = new LogBlocks(out, 1 << 20, 60_000);
    const blockLog = pino({ base: null, timestamp: false }, blocks);
    blockLog.info('waits');
    assert.deepEqual(written, []);
    blockLog.warn('now');
    assert.deepEqual(written, ['{"level":30,"msg":"waits"}\n{"level":40,"msg":"now"}\n']);
    blocks.flush();
  });
});
