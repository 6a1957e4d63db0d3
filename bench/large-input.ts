/**
 * `node dist/bench/large-input.js [items]`: how long one request with many input items (200,000 by
 * default, `store` on) holds the worker. Switchyard (one worker) in front of the fake upstream; while
 * the request runs, `GET /v1/models` is asked every 20 ms, one at a time: the slowest answers and
 * their statuses (503 is the load shedder seeing the stalled event loop). Once for a Responses
 * upstream and once for a chat one. Asserts nothing.
 */
import { request } from 'undici';
import { createBenchKey, spawnReady, startSwitchyard } from './lib.js';

const items = Number(process.argv[2] ?? 200_000);
const fake = await spawnReady('fake-upstream.js', ['0']);
const sy = await startSwitchyard({ upstream: fake.url, workers: 1 });
try {
  const key = await createBenchKey(sy.url);
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${key}` };
  const input = Array.from({ length: items }, () => ({ role: 'user', content: 'a' }));
  for (const model of ['openai/bench-responses', 'openai/bench-fake']) {
    let stop = false;
    const waits: number[] = [];
    const statuses: Record<number, number> = {};
    const poll = (async () => {
      while (!stop) {
        const t = performance.now();
        const r = await request(`${sy.url}/v1/models`, { headers });
        await r.body.text();
        statuses[r.statusCode] = (statuses[r.statusCode] ?? 0) + 1;
        waits.push(performance.now() - t);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    const t = performance.now();
    const r = await request(`${sy.url}/v1/responses`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ model, input, max_output_tokens: 2 }),
    });
    await r.body.text();
    const took = performance.now() - t;
    stop = true;
    await poll;
    waits.sort((a, b) => b - a);
    console.log(
      `${model}: ${items} items, status ${r.statusCode} in ${Math.round(took)} ms; /v1/models meanwhile ${JSON.stringify(statuses)}, ` +
        `slowest ${waits
          .slice(0, 3)
          .map((w) => Math.round(w))
          .join(', ')} ms`,
    );
  }
} finally {
  await sy.stop();
  await fake.stop();
}
