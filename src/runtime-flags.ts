/**
 * Node options the server runs with (docs/decisions.md, "A larger young generation"). V8 sizes its
 * heap when the process starts, so these cannot be set from inside it: `npm start`, `bin/switchyard.js`
 * and `deploy/switchyard.service` pass them on the command line, and a cluster's primary passes them
 * to its workers however it was started itself.
 *
 * `--max-semi-space-size=32`: under load each request in flight holds some tens of kilobytes, and
 * with V8's default semi-space (16 MB) the young generation filled every ~50 ms, so every
 * scavenge copied the live requests and promoted most of them to the old generation, which then
 * needed a full mark-compact every few seconds. Twice the room halves the scavenges and lets most
 * requests end before their objects are copied twice.
 */
export const SERVER_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=32'];

/** The option's name as V8 reads it: `--max-semi-space-size` and `--max_semi_space_size` are one option. */
const nameOf = (flag: string): string => flag.replace(/=.*/s, '').replaceAll('_', '-');

/**
 * `execArgv` with every server flag it does not set already (nor `NODE_OPTIONS`): a value given by
 * whoever starts the server wins.
 */
export function withServerFlags(execArgv: readonly string[], nodeOptions = process.env['NODE_OPTIONS'] ?? ''): string[] {
  const given = new Set([...execArgv, ...nodeOptions.split(/\s+/)].filter((a) => a.startsWith('--')).map(nameOf));
  return [...execArgv, ...SERVER_NODE_FLAGS.filter((f) => !given.has(nameOf(f)))];
}
