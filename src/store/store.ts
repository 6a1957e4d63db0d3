import type { Model } from '../core/model-spec.js';

export interface Org {
  id: string;
  name: string;
  created_at: number;
}

export type KeyRole = 'admin' | 'inference';

export interface ApiKeyRecord {
  id: string;
  org_id: string;
  name: string;
  role: KeyRole;
  /** Hex SHA-256 of the key's secret part; the key itself is never stored. */
  hash: string;
  created_at: number;
  revoked_at: number | null;
}

/** The one persistence interface; SQLite and PostgreSQL are dialects of the same implementation. */
export interface Store {
  readonly dialect: 'sqlite' | 'postgres';
  migrate(): Promise<void>;
  /** Throws when the database cannot be reached. */
  ping(): Promise<void>;
  close(): Promise<void>;

  createOrg(org: Org): Promise<void>;
  getOrg(id: string): Promise<Org | undefined>;
  listOrgs(): Promise<Org[]>;

  createKey(key: ApiKeyRecord): Promise<void>;
  getKey(id: string): Promise<ApiKeyRecord | undefined>;
  listKeys(orgId?: string): Promise<ApiKeyRecord[]>;
  /** Returns false when no such key exists. Revoking twice keeps the first time. */
  revokeKey(id: string, at: number): Promise<boolean>;
  countActiveAdminKeys(): Promise<number>;

  /** Insert or replace every field but `created`, which is kept when the entry already exists. */
  upsertModel(model: Model): Promise<void>;
  /** Insert; returns false when the id is taken. */
  insertModel(model: Model): Promise<boolean>;
  getModel(id: string): Promise<Model | undefined>;
  listModels(): Promise<Model[]>;
}
