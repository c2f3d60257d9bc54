// Stand-in for the runtime's `./db-session`: the session types runtime-api.ts
// names and the two schemas it calls (`createDbSessionResponseSchema.parse` /
// `.safeParse`, `rowsWriteResponseSchema.parse`). Like the zod object schemas
// they stand for, a parse keeps the members it knows and drops the others.

export type DbLogicalTable = 'sheet_rows' | 'dataset_rows' | 'play_output';

export type DbSessionOperation =
  | 'rows.read'
  | 'rows.upsert'
  | 'rows.append'
  | 'rows.replace';

export type DbSessionLimits = {
  maxRows?: number;
  maxBytes?: number;
  maxRequests?: number;
};

/** A flattened JWE (RFC 7516 section 7.2.2) and the pair of algorithms it uses. */
export type EncryptedPostgresUrl = {
  alg?: string;
  protected: string;
  encrypted_key: string;
  iv: string;
  ciphertext: string;
  tag: string;
  aad?: string;
};

export type DbSessionPostgresTables = {
  schema: string;
  sheetTable: string;
  eventTable: string;
  summaryTable: string;
  columnSummaryTable: string;
};

export type CreateDbSessionResponse = {
  playName: string;
  expiresAt: string;
  target: {
    orgId: string;
    tableNamespace: string;
    logicalTable: DbLogicalTable;
  };
  operations: DbSessionOperation[];
  limits?: DbSessionLimits;
  postgres?: DbSessionPostgresTables | null;
  postgresUrl?: string | null;
  encryptedPostgresUrl?: EncryptedPostgresUrl | null;
};

export type PreloadedRuntimeDbSession = {
  session: CreateDbSessionResponse;
  tableNamespace: string;
  logicalTable: DbLogicalTable;
  operations: DbSessionOperation[];
  limits?: DbSessionLimits;
};

export type RowsWriteResponse = {
  disposition: string;
  writtenRows: number;
};

type Schema<T> = {
  parse(value: unknown): T;
  safeParse(
    value: unknown,
  ): { success: true; data: T } | { success: false; error: Error };
};

function schema<T>(read: (value: unknown) => T): Schema<T> {
  return {
    parse: read,
    safeParse(value) {
      try {
        return { success: true, data: read(value) };
      } catch (error) {
        return { success: false, error: error as Error };
      }
    },
  };
}

function object(value: unknown, where: string): Record<string, unknown> {
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    throw new Error(`${where} must be an object`);
  }
  return value as Record<string, unknown>;
}

function text(value: unknown, where: string): string {
  if (typeof value !== 'string') {
    throw new Error(`${where} must be a string`);
  }
  return value;
}

function limits(value: unknown): DbSessionLimits | undefined {
  if (value === undefined || value === null) return undefined;
  const raw = object(value, 'limits');
  const result: DbSessionLimits = {};
  for (const key of ['maxRows', 'maxBytes', 'maxRequests'] as const) {
    if (raw[key] === undefined) continue;
    if (typeof raw[key] !== 'number') throw new Error(`limits.${key} must be a number`);
    result[key] = raw[key] as number;
  }
  return result;
}

function envelope(value: unknown): EncryptedPostgresUrl | null | undefined {
  if (value === undefined || value === null) return value as null | undefined;
  const raw = object(value, 'encryptedPostgresUrl');
  const result: EncryptedPostgresUrl = {
    protected: text(raw.protected, 'encryptedPostgresUrl.protected'),
    encrypted_key: text(raw.encrypted_key, 'encryptedPostgresUrl.encrypted_key'),
    iv: text(raw.iv, 'encryptedPostgresUrl.iv'),
    ciphertext: text(raw.ciphertext, 'encryptedPostgresUrl.ciphertext'),
    tag: text(raw.tag, 'encryptedPostgresUrl.tag'),
  };
  if (raw.alg !== undefined) result.alg = text(raw.alg, 'encryptedPostgresUrl.alg');
  if (raw.aad !== undefined) result.aad = text(raw.aad, 'encryptedPostgresUrl.aad');
  return result;
}

export const createDbSessionResponseSchema = schema<CreateDbSessionResponse>(
  (value) => {
    const raw = object(value, 'session');
    const target = object(raw.target, 'target');
    if (!Array.isArray(raw.operations)) throw new Error('operations must be an array');
    const postgres =
      raw.postgres === undefined || raw.postgres === null
        ? (raw.postgres as null | undefined)
        : (() => {
            const tables = object(raw.postgres, 'postgres');
            return {
              schema: text(tables.schema, 'postgres.schema'),
              sheetTable: text(tables.sheetTable, 'postgres.sheetTable'),
              eventTable: text(tables.eventTable, 'postgres.eventTable'),
              summaryTable: text(tables.summaryTable, 'postgres.summaryTable'),
              columnSummaryTable: text(
                tables.columnSummaryTable,
                'postgres.columnSummaryTable',
              ),
            };
          })();
    return {
      playName: text(raw.playName, 'playName'),
      expiresAt: text(raw.expiresAt, 'expiresAt'),
      target: {
        orgId: text(target.orgId, 'target.orgId'),
        tableNamespace: text(target.tableNamespace, 'target.tableNamespace'),
        logicalTable: text(target.logicalTable, 'target.logicalTable') as DbLogicalTable,
      },
      operations: raw.operations.map((op) => text(op, 'operations[]')) as DbSessionOperation[],
      limits: limits(raw.limits),
      postgres,
      postgresUrl:
        raw.postgresUrl === undefined || raw.postgresUrl === null
          ? (raw.postgresUrl as null | undefined)
          : text(raw.postgresUrl, 'postgresUrl'),
      encryptedPostgresUrl: envelope(raw.encryptedPostgresUrl),
    };
  },
);

export const rowsWriteResponseSchema = schema<RowsWriteResponse>((value) => {
  const raw = object(value, 'rows write response');
  if (typeof raw.writtenRows !== 'number') throw new Error('writtenRows must be a number');
  return {
    disposition: text(raw.disposition, 'disposition'),
    writtenRows: raw.writtenRows,
  };
});
