// Stand-in for the runtime's `./dataset-id`: one id per play and namespace, as
// sheetplane's `runtime_dataset_id` writes it (each normalised name
// percent-encoded).
import {
  normalizePlayNameForSheet,
  normalizeTableNamespace,
} from '../plays/row-identity';

export function createRuntimeDatasetId(
  playName: string,
  tableNamespace: string,
): string {
  return `sheet:${encodeURIComponent(normalizePlayNameForSheet(playName))}:${encodeURIComponent(normalizeTableNamespace(tableNamespace))}`;
}
