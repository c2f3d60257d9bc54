// Stand-in for the runtime's `./runtime-pg-driver`, written from its call sites
// in runtime-api.ts: `createRuntimePool({connectionString, maxConnections,
// idleTimeoutMs, connectTimeoutMs})`, `pool.connect()`, `pool.end()`,
// `client.query(text, params)` answering `{rows}`, `client.release()`.
// It runs on node-postgres (`pg`), and records each pool's options (never its
// connection string, a secret) so the interop driver can state what the
// runtime asked for.
import pg from 'pg';

export type RuntimePoolClient = {
  query<T = any>(text: string, params?: unknown[]): Promise<{ rows: T[] }>;
  release(): void;
};

export type RuntimePool = {
  connect(): Promise<RuntimePoolClient>;
  end(): Promise<void>;
};

export type RuntimePoolOptions = {
  connectionString: string;
  maxConnections: number;
  idleTimeoutMs: number;
  connectTimeoutMs: number;
};

export type RuntimePoolRecord = {
  maxConnections: number;
  idleTimeoutMs: number;
  connectTimeoutMs: number;
  connects: number;
  ended: boolean;
};

/** Every pool the runtime created, in order (read by the interop driver). */
export const runtimePoolRecords: RuntimePoolRecord[] = [];

export function createRuntimePool(options: RuntimePoolOptions): RuntimePool {
  const record: RuntimePoolRecord = {
    maxConnections: options.maxConnections,
    idleTimeoutMs: options.idleTimeoutMs,
    connectTimeoutMs: options.connectTimeoutMs,
    connects: 0,
    ended: false,
  };
  runtimePoolRecords.push(record);
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.maxConnections,
    idleTimeoutMillis: options.idleTimeoutMs,
    connectionTimeoutMillis: options.connectTimeoutMs,
  });
  // An idle connection the server drops must not crash the process.
  pool.on('error', () => undefined);
  let ended: Promise<void> | null = null;
  return {
    async connect() {
      const client = await pool.connect();
      record.connects += 1;
      return {
        query: async (text: string, params?: unknown[]) =>
          await client.query(text, params as unknown[] | undefined),
        release: () => client.release(),
      } as RuntimePoolClient;
    },
    end() {
      record.ended = true;
      ended ??= pool.end();
      return ended;
    },
  };
}
