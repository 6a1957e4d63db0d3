import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import type { Store } from '../store/store.js';

const VERSION = 1;

export type SealPurpose = 'reasoning' | 'compaction' | 'thinking';
const aad = (org: string, purpose: SealPurpose): Buffer => Buffer.from(purpose === 'reasoning' ? org : `${purpose}:${org}`);

/**
 * Seals reasoning for `include: ["reasoning.encrypted_content"]`: AES-256-GCM under a server
 * secret, with the organization as associated data, so content is unreadable to clients, cannot be
 * altered, and cannot be replayed into another organization's requests.
 */
export class ReasoningSeal {
  private constructor(private readonly key: Buffer) {}

  /**
   * The secret comes from configuration, or else from the database, where the first instance to
   * start stores a random one, so every instance sharing the database can open what another sealed.
   */
  static async open(store: Store, configured: string | undefined): Promise<ReasoningSeal> {
    const secret = configured ?? (await store.setSettingOnce('reasoning_seal_key', randomBytes(32).toString('base64')));
    return new ReasoningSeal(createHash('sha256').update(`switchyard-reasoning:${secret}`).digest());
  }

  /**
   * `purpose` keeps one kind of sealed content from being accepted as another (a compaction summary
   * sent as reasoning); reasoning, the first kind, is bound to the organization alone.
   */
  seal(text: string, org: string, purpose: SealPurpose = 'reasoning'): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.key, iv);
    cipher.setAAD(aad(org, purpose));
    const body = Buffer.concat([cipher.update(text, 'utf8'), cipher.final()]);
    return Buffer.concat([Buffer.from([VERSION]), iv, body, cipher.getAuthTag()]).toString('base64url');
  }

  /** Returns undefined when the content was not sealed here, for this organization, or was altered. */
  unseal(sealed: string, org: string, purpose: SealPurpose = 'reasoning'): string | undefined {
    const raw = Buffer.from(sealed, 'base64url');
    if (raw.length < 1 + 12 + 16 || raw[0] !== VERSION) return undefined;
    try {
      const decipher = createDecipheriv('aes-256-gcm', this.key, raw.subarray(1, 13));
      decipher.setAAD(aad(org, purpose));
      decipher.setAuthTag(raw.subarray(raw.length - 16));
      return Buffer.concat([decipher.update(raw.subarray(13, raw.length - 16)), decipher.final()]).toString('utf8');
    } catch {
      return undefined;
    }
  }
}
