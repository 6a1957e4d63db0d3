import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress, type LookupAllOptions, type LookupOneOptions } from 'node:dns';
import { buildConnector } from 'undici';

/** IPv4 addresses a server should not be talked into reaching for someone else (SSRF). */
const INTERNAL_V4 = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const)
  INTERNAL_V4.addSubnet(net, bits, 'ipv4');

/** IPv6 ranges that are internal in themselves: unspecified, loopback, unique-local, link-local, site-local, multicast, discard, local-use NAT64. */
const INTERNAL_V6: ReadonlyArray<[prefix: number[], bits: number]> = [
  [[], 128],
  [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 128],
  [[0xfc], 7],
  [[0xfe, 0x80], 10],
  [[0xfe, 0xc0], 10],
  [[0xff], 8],
  [[0x01, 0x00, 0, 0, 0, 0, 0, 0], 64],
  [[0x00, 0x64, 0xff, 0x9b, 0x00, 0x01], 48],
];

/** The 16 bytes of an IPv6 address (with an optional dotted IPv4 tail), or undefined. */
function v6Bytes(address: string): number[] | undefined {
  let text = address.replace(/%.*$/, '');
  const tail: number[] = [];
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    tail.push(...dotted.slice(1, 5).map(Number));
    text = `${text.slice(0, dotted.index)}0:0`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const words = (part: string | undefined) => (part ? part.split(':').map((w) => parseInt(w, 16)) : []);
  const head = words(halves[0]);
  const rest = halves.length === 2 ? words(halves[1]) : [];
  const fill = 8 - head.length - rest.length;
  if (fill < 0 || (halves.length === 1 && fill !== 0)) return undefined;
  const all = [...head, ...Array<number>(fill).fill(0), ...rest];
  if (all.some((w) => !(w >= 0 && w <= 0xffff))) return undefined;
  const bytes = all.flatMap((w) => [w >> 8, w & 0xff]);
  if (tail.length) bytes.splice(12, 4, ...tail);
  return bytes;
}

const inPrefix = (bytes: number[], prefix: number[], bits: number): boolean => {
  for (let i = 0; i < bits; i++) {
    const p = ((prefix[i >> 3] ?? 0) >> (7 - (i & 7))) & 1;
    if (((bytes[i >> 3]! >> (7 - (i & 7))) & 1) !== p) return false;
  }
  return true;
};
const v4 = (b: number[]): string => b.join('.');

/**
 * IPv4 addresses an IPv6 address carries, which routers and NAT64 gateways may deliver to: the
 * IPv4-compatible (::a.b.c.d), -mapped (::ffff:a.b.c.d) and -translated (::ffff:0:a.b.c.d) forms,
 * NAT64 (64:ff9b::/96), 6to4 (2002::/16) and Teredo (2001::/32, server and client).
 */
function embeddedV4(b: number[]): string[] {
  const zero = (from: number, to: number) => b.slice(from, to).every((x) => x === 0);
  const low = v4(b.slice(12, 16));
  if (zero(0, 12)) return [low];
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return [low];
  if (zero(0, 8) && b[8] === 0xff && b[9] === 0xff && zero(10, 12)) return [low];
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zero(4, 12)) return [low];
  if (b[0] === 0x20 && b[1] === 0x02) return [v4(b.slice(2, 6))];
  if (b[0] === 0x20 && b[1] === 0x01 && b[2] === 0 && b[3] === 0) return [v4(b.slice(4, 8)), v4(b.slice(12, 16).map((x) => x ^ 0xff))];
  return [];
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** A host name as an allow-list entry may give one: labels of letters, digits, `-` and `_`, dot-separated. */
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?$/i;

/**
 * Why an entry of the upstream allow list is not one (undefined when it is): `*`, an IP address, a
 * CIDR block with a whole prefix length in range, or a host name. A hostile pass found `10.0.0.0/`
 * read as `10.0.0.0/0`, every IPv4 address, and `10.0.0.0/99` failing the start with a RangeError.
 */
export function allowEntryProblem(entry: string): string | undefined {
  if (entry === '*') return undefined;
  const slash = entry.indexOf('/');
  if (slash < 0) {
    if (isIP(entry) || (HOST_NAME.test(entry) && !/^[\d.]+$/.test(entry))) return undefined;
    return `'${entry}' is not an IP address, a CIDR block (address/prefix length) or a host name`;
  }
  const net = entry.slice(0, slash);
  const bits = entry.slice(slash + 1);
  const family = isIP(net);
  if (!family) return `'${entry}': '${net}' is not an IP address`;
  const max = family === 6 ? 128 : 32;
  if (!/^\d{1,3}$/.test(bits) || Number(bits) > max) return `'${entry}': the prefix length must be a whole number from 0 to ${max}`;
  return undefined;
}

/**
 * Which upstream addresses deployments stored in the database may reach. Internal addresses
 * (loopback, private, link-local, metadata) are refused unless allowed by host name or CIDR; the
 * check runs when the URL is set and again on every connection, so a DNS answer that changes later
 * (rebinding) cannot get around it.
 */
export class AddressPolicy {
  private readonly allowAll: boolean;
  private readonly nets = new BlockList();
  private readonly hosts = new Set<string>();

  constructor(allow: readonly string[]) {
    this.allowAll = allow.includes('*');
    for (const entry of allow) {
      const problem = allowEntryProblem(entry);
      // The configuration refuses these first (config.ts); never read one as something wider.
      if (problem) throw new Error(`upstream allow list: ${problem}`);
      const [net = '', bits] = entry.split('/');
      const type = isIP(net) === 6 ? 'ipv6' : 'ipv4';
      if (isIP(net) && bits !== undefined) this.nets.addSubnet(net, Number(bits), type);
      else if (isIP(net)) this.nets.addAddress(net, type);
      else this.hosts.add(entry.toLowerCase());
    }
  }

  private allowed(address: string): boolean {
    return this.nets.check(address, isIP(address) === 6 ? 'ipv6' : 'ipv4');
  }

  /** True when this address may not be reached: it is internal, or carries an internal IPv4 address. */
  refuses(address: string): boolean {
    if (this.allowAll || this.allowed(address)) return false;
    if (isIP(address) === 4) return INTERNAL_V4.check(address, 'ipv4');
    const bytes = v6Bytes(address);
    if (!bytes) return true;
    if (INTERNAL_V6.some(([prefix, bits]) => inPrefix(bytes, prefix, bits))) return true;
    return embeddedV4(bytes).some((a) => INTERNAL_V4.check(a, 'ipv4') && !this.allowed(a));
  }

  private hostAllowed(hostname: string): boolean {
    return this.allowAll || this.hosts.has(hostname.toLowerCase().replace(/^\[|\]$/g, ''));
  }

  /** Why a URL may not be used for a stored deployment, or undefined when it may. */
  async check(url: string): Promise<string | undefined> {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      return 'it is not a valid URL';
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return 'only http and https upstreams are allowed';
    if (parsed.username || parsed.password) return 'credentials in the URL are not allowed (use api_key_env)';
    const host = parsed.hostname.replace(/^\[|\]$/g, '');
    if (this.hostAllowed(host)) return undefined;
    let addresses: string[];
    try {
      addresses = isIP(host)
        ? [host]
        : (
            await new Promise<LookupAddress[]>((resolve, reject) => {
              dnsLookup(host, { all: true }, (err, a) => (err ? reject(err) : resolve(a)));
            })
          ).map((a) => a.address);
    } catch {
      return `its host '${host}' does not resolve`;
    }
    const bad = addresses.find((a) => this.refuses(a));
    return bad ? `its host resolves to the internal address ${bad}; allow it with SWITCHYARD_UPSTREAM_ALLOW` : undefined;
  }

  /** A DNS lookup for sockets that drops refused addresses (and fails when none is left). */
  private readonly lookup = (hostname: string, options: LookupOneOptions | LookupAllOptions, callback: LookupCallback): void => {
    dnsLookup(hostname, { ...options, all: true }, (err, found) => {
      if (err) return callback(err, []);
      const ok = this.hostAllowed(hostname) ? found : found.filter((a) => !this.refuses(a.address));
      if (ok.length === 0) {
        const e: NodeJS.ErrnoException = new Error(
          `upstream host ${hostname} resolves only to internal addresses, which SWITCHYARD_UPSTREAM_ALLOW does not permit`,
        );
        e.code = 'EADDRNOTPERMITTED';
        return callback(e, []);
      }
      if (options.all) return callback(null, ok);
      callback(null, ok[0]!.address, ok[0]!.family);
    });
  };

  /** An undici connector that applies the policy to every connection it opens. */
  connector(timeout: number): buildConnector.connector {
    const inner = buildConnector({ timeout, lookup: this.lookup } as buildConnector.BuildOptions);
    return (opts, callback) => {
      const host = opts.hostname.replace(/^\[|\]$/g, '');
      if (isIP(host) && !this.hostAllowed(host) && this.refuses(host)) {
        const e: NodeJS.ErrnoException = new Error(
          `upstream address ${host} is internal, and SWITCHYARD_UPSTREAM_ALLOW does not permit it`,
        );
        e.code = 'EADDRNOTPERMITTED';
        callback(e, null);
        return;
      }
      inner(opts, callback);
    };
  }
}
