import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress, type LookupAllOptions, type LookupOneOptions } from 'node:dns';
import { buildConnector } from 'undici';

/** Addresses a server should not be talked into reaching for someone else (SSRF). */
const INTERNAL = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
  ['192.0.0.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const) INTERNAL.addSubnet(net, bits, 'ipv4');
for (const [net, bits] of [['::', 128], ['::1', 128], ['fc00::', 7], ['fe80::', 10], ['ff00::', 8]] as const) INTERNAL.addSubnet(net, bits, 'ipv6');

/** `::ffff:10.0.0.1` is 10.0.0.1. */
function plain(address: string): { address: string; type: 'ipv4' | 'ipv6' } {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return { address: mapped[1]!, type: 'ipv4' };
  return { address, type: isIP(address) === 6 ? 'ipv6' : 'ipv4' };
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

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
      const [net, bits] = entry.split('/');
      const ip = net ? plain(net) : undefined;
      if (ip && isIP(ip.address) && bits !== undefined) this.nets.addSubnet(ip.address, Number(bits), ip.type);
      else if (ip && isIP(ip.address)) this.nets.addAddress(ip.address, ip.type);
      else this.hosts.add(entry.toLowerCase());
    }
  }

  /** True when this address may not be reached. */
  refuses(address: string): boolean {
    if (this.allowAll) return false;
    const ip = plain(address);
    return INTERNAL.check(ip.address, ip.type) && !this.nets.check(ip.address, ip.type);
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
      addresses = isIP(host) ? [host] : (await new Promise<LookupAddress[]>((resolve, reject) => {
        dnsLookup(host, { all: true }, (err, a) => (err ? reject(err) : resolve(a)));
      })).map((a) => a.address);
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
        const e: NodeJS.ErrnoException = new Error(`upstream host ${hostname} resolves only to internal addresses, which SWITCHYARD_UPSTREAM_ALLOW does not permit`);
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
        callback(new Error(`upstream address ${host} is internal, and SWITCHYARD_UPSTREAM_ALLOW does not permit it`), null);
        return;
      }
      inner(opts, callback);
    };
  }
}
