// Stand-in for the runtime's `../plays/row-identity`. The names follow
// sheetplane's rule (sheetplane.names: trim, lower-case, NFC) and the row
// identity is sheetplane's content identity (sheetplane.identity): "r" and 32
// hex digits of SHA-256 over the row's canonical JSON (sorted keys, compact),
// fields starting with "_" left out. So a row the seed admits and the same row
// sheetplane admits get one key.
import { createHash } from 'node:crypto';

function normalizeName(what: string, value: string): string {
  const normalized = String(value ?? '').trim().toLowerCase().normalize('NFC');
  if (!normalized) {
    throw new Error(`${what} must not be empty once trimmed`);
  }
  return normalized;
}

export function normalizeTableNamespace(value: string): string {
  return normalizeName('table_namespace', value);
}

export function normalizePlayNameForSheet(value: string): string {
  return normalizeName('play_name', value);
}

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) {
    return `[${value.map(canonicalJson).join(',')}]`;
  }
  if (value && typeof value === 'object') {
    const entries = Object.keys(value as Record<string, unknown>)
      .sort()
      .map(
        (key) =>
          `${JSON.stringify(key)}:${canonicalJson((value as Record<string, unknown>)[key])}`,
      );
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(value);
}

export function derivePlayRowIdentity(
  row: Record<string, unknown>,
  tableNamespace: string,
): string {
  normalizeTableNamespace(tableNamespace);
  const content = Object.fromEntries(
    Object.entries(row).filter(([name]) => !name.startsWith('_')),
  );
  const digest = createHash('sha256')
    .update(canonicalJson(content), 'utf8')
    .digest('hex');
  return `r${digest.slice(0, 32)}`;
}
