/**
 * Node options the server runs with (docs/decisions.md, "A larger young generation"). V8 sizes its
 * heap when the process starts, so these cannot be set from inside it: `npm start` and
 * `deploy/switchyard.service` put them in `NODE_OPTIONS` (before the starter's own, so a value the
 * starter gives wins), and a cluster's primary passes them to its workers when neither its command
 * line nor `NODE_OPTIONS` has them.
 *
 * `--max-semi-space-size=32`: under load each request in flight holds some tens of kilobytes, and
 * with V8's default semi-space (16 MB) the young generation filled every ~50 ms at 64 connections,
 * so every scavenge copied the requests in flight, most of them for the second time, and promoted
 * them to the old generation, which then needed a full mark-compact every few seconds. Twice the
 * room lets most requests end before their objects are copied twice.
 */
export const SERVER_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=32'];

/**
 * The option's name as V8 reads it: one or two leading dashes, `-` or `_` between words, quotes
 * around it in `NODE_OPTIONS` (`"--max-semi-space-size=8"`) are all the same option.
 */
const nameOf = (arg: string): string => arg.replaceAll('"', '').replace(/^--?/, '').replace(/=.*/s, '').replaceAll('_', '-');

/**
 * `execArgv` with every server flag that neither it nor `nodeOptions` sets: a value given by whoever
 * starts the server wins.
 */
export function withServerFlags(execArgv: readonly string[], nodeOptions = process.env['NODE_OPTIONS'] ?? ''): string[] {
  const given = new Set([...execArgv, ...nodeOptions.split(/\s+/)].filter((a) => a.replaceAll('"', '').startsWith('-')).map(nameOf));
  return [...execArgv, ...SERVER_NODE_FLAGS.filter((f) => !given.has(nameOf(f)))];
}
