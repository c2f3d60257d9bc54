// The interop driver: the seed's runtime-api.ts (extracted at test time beside
// this file) run against `sheetplane serve`. It reads its configuration as JSON
// from the file named by argv[2], runs every case in order, and prints one JSON
// object on stdout: {cases: {name: {ok, error?, detail?}}}. A case passes when
// the seed's exported function runs on its own road and answers what the seed's
// own semantics say it answers (node:assert), and hands back what it read for
// the Python side to compare with sheetplane's runtime.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  appendRuntimeRows,
  completeRuntimeMapRows,
  createRuntimeBackedPlayDataset,
  ensureRuntimeSheet,
  persistRuntimeCsvDataset,
  prewarmRuntimePostgresSessions,
  replaceRuntimeRows,
  resolveRuntimeReferencedPlay,
  resolveRuntimeSheetContract,
  startRuntimeSheetDataset,
  upsertRuntimeRows,
} from './runtime-api';
import { runtimePoolRecords } from './runtime-pg-driver';
import { createDbSessionResponseSchema } from './db-session';
import type { PreloadedRuntimeDbSession } from './db-session';
import {
  dbSessionPostgresUrlAad,
  decryptDbSessionPostgresUrlWithPrivateKey,
  generateDbSessionPostgresUrlDecryptionKey,
} from './db-session-crypto';
import { derivePlayRowIdentity } from '../plays/row-identity';
import type { PlaySheetContract } from './static-pipeline-types';

type Row = Record<string, unknown>;

type Config = {
  baseUrl: string;
  token: string;
  orgId: string;
  playName: string;
  runId: string;
  prefix: string;
  contract: PlaySheetContract;
  playRef: string;
  playId: string;
  only?: string[] | null;
  // Sheets sheetplane's runtime wrote before this run, by road, with the rows
  // sheetplane read back from them.
  sheetplaneSheets: Record<string, { tableNamespace: string; rows: Row[]; inputRows: Row[] }>;
  // A sheet sheetplane admitted three rows into and failed the middle one of.
  failedSheet: { tableNamespace: string; inputRows: Row[]; failedKey: string };
};

const config = JSON.parse(readFileSync(process.argv[2]!, 'utf8')) as Config;
const contract = config.contract;

function context(extra: Record<string, unknown> = {}) {
  return {
    baseUrl: config.baseUrl,
    executorToken: config.token,
    orgId: config.orgId,
    playName: config.playName,
    ...extra,
  };
}

function ns(name: string): string {
  return `${config.prefix}-${name}`;
}

function person(name: string, company: string): Row {
  return { name, company };
}

function dataset(tableNamespace: string, extra: Record<string, unknown> = {}) {
  return createRuntimeBackedPlayDataset({
    context: context(extra),
    tableNamespace,
    datasetKind: 'map',
  });
}

async function collect(iterable: AsyncIterable<Row>): Promise<Row[]> {
  const rows: Row[] = [];
  for await (const row of iterable) rows.push(row);
  return rows;
}

function key(row: Row, tableNamespace: string): string {
  return derivePlayRowIdentity(row, tableNamespace);
}

const EMPTY_OUTPUTS = { email: null };

const cases: Record<string, () => Promise<unknown>> = {
  async resolveRuntimeReferencedPlay() {
    const play = await resolveRuntimeReferencedPlay(context(), config.playRef);
    assert.ok(play, 'the registered play resolves');
    assert.equal(play.playId, config.playId);
    assert.equal(play.sourceCode, 'export default async () => 1;');
    assert.equal(await resolveRuntimeReferencedPlay(context(), `${config.playRef}-missing`), null);
    return { play };
  },

  async ensureRuntimeSheet() {
    const tableNamespace = ns('ensure');
    await ensureRuntimeSheet(context(), { playName: config.playName, tableNamespace, sheetContract: contract });
    // Twice: ensuring is idempotent.
    await ensureRuntimeSheet(context(), { playName: config.playName, tableNamespace, sheetContract: contract });
    return { tableNamespace };
  },

  async startRuntimeSheetDataset() {
    const tableNamespace = ns('start');
    const ada = person('Ada', 'A');
    const bob = person('Bob', 'B');
    const cy = { ...person('Cy', 'C'), __deeplineRowKey: 'k-cy' };
    const input = [ada, bob, { ...ada }, cy];
    const first = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: input, runId: config.runId,
    });
    assert.equal(first.inserted, 3);
    assert.equal(first.skipped, 1);
    assert.deepEqual(first.pendingRows, [ada, bob, person('Cy', 'C')]);
    assert.deepEqual(first.completedRows, []);
    assert.equal(first.tableNamespace, tableNamespace);
    const again = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: input, runId: config.runId,
    });
    // Pending rows stay pending; skipped is input rows - inserted.
    assert.equal(again.inserted, 0);
    assert.equal(again.skipped, 4);
    assert.equal(again.pendingRows.length, 3);
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [
      { ...ada, ...EMPTY_OUTPUTS },
      { ...bob, ...EMPTY_OUTPUTS },
      { ...person('Cy', 'C'), ...EMPTY_OUTPUTS },
    ]);
    return { tableNamespace, rows, first, again };
  },

  async completeRuntimeMapRows() {
    const tableNamespace = ns('complete');
    const ada = person('Ada', 'A');
    const bob = person('Bob', 'B');
    const cy = { ...person('Cy', 'C'), __deeplineRowKey: 'k-cy' };
    await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: [ada, bob, cy], runId: config.runId,
    });
    const completed = await completeRuntimeMapRows(context(), {
      tableNamespace,
      sheetContract: contract,
      runId: config.runId,
      rows: [
        { key: key(ada, tableNamespace), data: { ...ada, email: 'ada@a.example' } },
        { key: 'k-cy', data: { ...person('Cy', 'C'), email: 'cy@c.example' }, cellMetaPatch: { email: { source: 'interop' } } },
        { key: 'k-nowhere', data: { email: 'x@x.example' } },
      ],
    });
    assert.deepEqual(completed, { updated: 2 });
    const readmitted = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: [ada, bob, cy], runId: config.runId,
    });
    assert.equal(readmitted.inserted, 0);
    assert.equal(readmitted.skipped, 3);
    assert.deepEqual(readmitted.pendingRows, [bob]);
    assert.deepEqual(readmitted.completedRows, [
      { ...ada, email: 'ada@a.example', __deeplineRowKey: key(ada, tableNamespace) },
      { ...person('Cy', 'C'), email: 'cy@c.example', __deeplineRowKey: 'k-cy' },
    ]);
    const rows = await dataset(tableNamespace).materialize();
    return { tableNamespace, rows };
  },

  async upsertRuntimeRows() {
    const tableNamespace = ns('upsert');
    const one = person('Una', 'U');
    const two = person('Dos', 'D');
    const input = { playName: config.playName, tableNamespace, rows: [one, two, { ...one }], runId: config.runId, sheetContract: contract };
    assert.deepEqual(await upsertRuntimeRows(context(), input), { disposition: 'completed', writtenRows: 2 });
    assert.deepEqual(await upsertRuntimeRows(context(), input), { disposition: 'completed', writtenRows: 0 });
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [{ ...one, ...EMPTY_OUTPUTS }, { ...two, ...EMPTY_OUTPUTS }]);
    return { tableNamespace, rows };
  },

  async appendRuntimeRows() {
    const tableNamespace = ns('append');
    const one = person('Ann', 'A');
    const two = person('Ben', 'B');
    const write = (rows: Row[], idempotencyKey: string) =>
      appendRuntimeRows(context(), { playName: config.playName, tableNamespace, rows, runId: config.runId, idempotencyKey, sheetContract: contract });
    assert.deepEqual(await write([one, two], 'append-1'), { disposition: 'completed', writtenRows: 2 });
    // The same content under another key is another row.
    assert.deepEqual(await write([one], 'append-2'), { disposition: 'completed', writtenRows: 1 });
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [one, two, one].map((row) => ({ ...row, ...EMPTY_OUTPUTS })));
    return { tableNamespace, rows };
  },

  async replaceRuntimeRows() {
    const tableNamespace = ns('replace');
    const old = [person('Old', 'O'), person('Gone', 'G')];
    const fresh = [person('New', 'N'), person('Next', 'X')];
    await appendRuntimeRows(context(), { playName: config.playName, tableNamespace, rows: old, runId: config.runId, idempotencyKey: 'before-replace', sheetContract: contract });
    const replaced = await replaceRuntimeRows(context(), { playName: config.playName, tableNamespace, rows: fresh, runId: config.runId, idempotencyKey: 'replace-1', sheetContract: contract });
    assert.deepEqual(replaced, { disposition: 'completed', writtenRows: 2 });
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, fresh.map((row) => ({ ...row, ...EMPTY_OUTPUTS })));
    return { tableNamespace, rows };
  },

  async persistRuntimeCsvDataset() {
    const small = [person('S1', 'S'), person('S2', 'S')];
    const held = await persistRuntimeCsvDataset(context(), {
      tableNamespace: ns('csv-small'), sheetContract: contract, rows: small, runId: config.runId, sourceLabel: 'small.csv',
    });
    assert.equal(held.datasetKind, 'csv');
    assert.equal(held.backing, null);
    assert.equal(await held.count(), 2);
    assert.deepEqual(await held.materialize(), small);
    const large = Array.from({ length: 12 }, (_, index) => person(`L${index}`, 'L'));
    const backed = await persistRuntimeCsvDataset(context(), {
      tableNamespace: ns('csv-large'), sheetContract: contract, rows: large, runId: config.runId, sourceLabel: 'large.csv',
    });
    assert.equal(backed.datasetKind, 'csv');
    assert.equal(backed.backing?.storage, 'neon_sheet');
    assert.deepEqual(backed.previewRows, large.slice(0, 10));
    assert.equal(await backed.count(), 12);
    assert.deepEqual(
      await backed.materialize(),
      large.map((row) => ({ ...row, ...EMPTY_OUTPUTS })),
    );
    return { tableNamespace: ns('csv-large') };
  },

  async prewarmRuntimePostgresSessions() {
    // A harness mints the session ahead of the run (public-key encryption) and
    // hands it to the runtime opened, as preloadedDbSessions.
    const tableNamespace = ns('prewarm');
    await ensureRuntimeSheet(context(), { playName: config.playName, tableNamespace, sheetContract: contract });
    const operations = ['rows.read'] as const;
    const key = await generateDbSessionPostgresUrlDecryptionKey();
    const response = await fetch(`${config.baseUrl}/api/v2/plays/internal/runtime`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${config.token}` },
      body: JSON.stringify({
        action: 'create_db_session',
        playName: config.playName,
        target: { tableNamespace, logicalTable: 'sheet_rows' },
        operations,
        ttlSeconds: 600,
        postgresUrlEncryption: key.request,
      }),
    });
    assert.equal(response.status, 200, await response.clone().text());
    const session = createDbSessionResponseSchema.parse(await response.json());
    const { encryptedPostgresUrl, ...withoutUrl } = session;
    assert.ok(encryptedPostgresUrl, 'the session answer carries an encrypted URL');
    const postgresUrl = await decryptDbSessionPostgresUrlWithPrivateKey({
      encrypted: encryptedPostgresUrl,
      privateKey: key.privateKey,
      aad: dbSessionPostgresUrlAad(withoutUrl),
    });
    const preloaded: PreloadedRuntimeDbSession = {
      session: { ...withoutUrl, postgresUrl },
      tableNamespace,
      logicalTable: 'sheet_rows',
      operations: [...operations],
    };
    const before = runtimePoolRecords.length;
    await prewarmRuntimePostgresSessions(context({ preloadedDbSessions: [preloaded] }));
    const pools = runtimePoolRecords.slice(before);
    assert.equal(pools.length, 1);
    assert.equal(pools[0]!.maxConnections, 4);
    assert.equal(pools[0]!.idleTimeoutMs, 15_000);
    assert.equal(pools[0]!.connects, 1);
    assert.equal(pools[0]!.ended, false, 'the seed keeps the prewarmed pool');
    // The prewarmed pool serves the next read of that session: no new pool.
    const rows = await dataset(tableNamespace, { preloadedDbSessions: [preloaded] }).peek(5);
    assert.deepEqual(rows, []);
    assert.equal(runtimePoolRecords.length, before + 1);
    assert.equal(pools[0]!.connects, 2);
    return { pools };
  },

  async datasetCount() {
    const tableNamespace = await mapSheet();
    assert.equal(await dataset(tableNamespace).count(), 5);
    return { tableNamespace };
  },

  async datasetPeek() {
    const tableNamespace = await mapSheet();
    const rows = await dataset(tableNamespace).peek(2);
    assert.deepEqual(rows, MAP_ROWS.slice(0, 2));
    assert.deepEqual(await dataset(tableNamespace).peek(0), []);
    return { tableNamespace, rows };
  },

  async datasetMaterialize() {
    const tableNamespace = await mapSheet();
    assert.deepEqual(await dataset(tableNamespace).materialize(), MAP_ROWS);
    assert.deepEqual(await dataset(tableNamespace).materialize(3), MAP_ROWS.slice(0, 3));
    return { tableNamespace };
  },

  async datasetIterate() {
    const tableNamespace = await mapSheet();
    assert.deepEqual(await collect(dataset(tableNamespace)), MAP_ROWS);
    return { tableNamespace };
  },

  async resolveRuntimeSheetContract() {
    const pipeline = {
      tableNamespace: 'Root',
      sheetContract: contract,
      stages: [{ type: 'map', tableNamespace: 'Stage', sheetContract: { columns: [] } }],
      substeps: [{ type: 'map', tableNamespace: 'Sub', sheetContract: null }],
    };
    assert.equal(resolveRuntimeSheetContract(pipeline, ' root '), contract);
    assert.deepEqual(resolveRuntimeSheetContract(pipeline, 'STAGE'), { columns: [] });
    assert.equal(resolveRuntimeSheetContract(pipeline, 'sub'), null);
    assert.equal(resolveRuntimeSheetContract(pipeline, 'none'), null);
    return {};
  },

  // Cross-reads. The seed writes a sheet (admission, completion, append); the
  // Python side reads it with sheetplane's runtime on both roads and compares
  // with what the seed read here.
  async seedWritesSheetplaneReads() {
    const tableNamespace = await mapSheet();
    const rows = await dataset(tableNamespace).materialize();
    return { tableNamespace, rows };
  },

  // sheetplane's runtime wrote these sheets (on each of its roads) before the
  // driver started; the seed reads them back, and re-admits their input.
  async sheetplaneWritesSeedReads() {
    const read: Record<string, unknown> = {};
    for (const [road, sheet] of Object.entries(config.sheetplaneSheets)) {
      const rows = await dataset(sheet.tableNamespace).materialize();
      assert.equal(await dataset(sheet.tableNamespace).count(), sheet.rows.length);
      read[road] = rows;
    }
    return { read };
  },

  async seedReadmitsSheetplaneRows() {
    // sheetplane admitted four rows and completed the middle two (email); the
    // seed admits the same input again: nothing new, the open rows to map, the
    // completed ones merged with their stored outputs, keyed as sheetplane keyed
    // them.
    const answers: Record<string, unknown> = {};
    for (const [road, sheet] of Object.entries(config.sheetplaneSheets)) {
      const input = sheet.inputRows;
      const answer = await startRuntimeSheetDataset(context(), {
        playName: config.playName, tableNamespace: sheet.tableNamespace, sheetContract: contract,
        rows: input, runId: `${config.runId}-again`,
      });
      assert.equal(answer.inserted, 0, road);
      assert.equal(answer.skipped, input.length, road);
      assert.deepEqual(answer.pendingRows, [input[0], input[3]], road);
      assert.deepEqual(
        answer.completedRows,
        [input[1]!, input[2]!].map((row) => ({
          ...row,
          email: `${String(row.name)}@x.example`,
          __deeplineRowKey: key(row, sheet.tableNamespace),
        })),
        road,
      );
      answers[road] = answer;
    }
    return { answers };
  },

  // The seed's side of stated differences (docs/parity.md).

  async startRuntimeSheetDatasetWithoutPoolCache() {
    // disablePostgresPoolCache: a request-local pool, one connection, ended after.
    const tableNamespace = ns('no-pool-cache');
    const before = runtimePoolRecords.length;
    const answer = await startRuntimeSheetDataset(context({ disablePostgresPoolCache: true }), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: [person('P', 'P')], runId: config.runId,
    });
    assert.equal(answer.inserted, 1);
    const pools = runtimePoolRecords.slice(before);
    assert.deepEqual(pools, [
      { maxConnections: 1, idleTimeoutMs: 0, connectTimeoutMs: 10_000, connects: 1, ended: true },
    ]);
    return { pools };
  },

  async columnFieldPerPath() {
    // An input column read from `name` (id fullName, sql name full_name) and an
    // output column whose id is not its sql name: the seed's admission reads the
    // sql name, its append the field, its completion an output's sql name.
    const named: PlaySheetContract = {
      columns: [
        { id: 'fullName', sqlName: 'full_name', source: 'input', field: 'name' },
        { id: 'score', sqlName: 'score_col', source: 'output' },
      ],
    };
    const tableNamespace = ns('named');
    const ada = { name: 'Ada' };
    await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: named, rows: [ada], runId: config.runId,
    });
    await appendRuntimeRows(context(), {
      playName: config.playName, tableNamespace, rows: [{ name: 'Bo' }], runId: config.runId, idempotencyKey: 'named-1', sheetContract: named,
    });
    await completeRuntimeMapRows(context(), {
      tableNamespace, sheetContract: named, runId: config.runId,
      rows: [{ key: key(ada, tableNamespace), data: { score: 3 } }],
    });
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [
      { full_name: null, score_col: null },
      { full_name: 'Bo', score_col: null },
    ]);
    return { tableNamespace, rows };
  },

  async upsertInputIndexWithinTheCall() {
    // A new upserted row takes its position within the call as _input_index.
    const tableNamespace = ns('upsert-index');
    const [first, second, fresh] = [person('I0', 'I'), person('I1', 'I'), person('New', 'N')];
    await appendRuntimeRows(context(), {
      playName: config.playName, tableNamespace, rows: [first, second], runId: config.runId, idempotencyKey: 'index-1', sheetContract: contract,
    });
    await upsertRuntimeRows(context(), {
      playName: config.playName, tableNamespace, rows: [fresh], runId: config.runId, sheetContract: contract,
    });
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [first, fresh, second].map((row) => ({ ...row, ...EMPTY_OUTPUTS })));
    return { tableNamespace, rows };
  },

  async readmissionMergeTakesTheStoredNull() {
    // A row admitted without `company`, completed, then admitted again under
    // its own key with `company`: the seed's completed row takes the stored
    // null over the input's value, and the stored row keeps its null.
    const tableNamespace = ns('merge-null');
    const first = { __deeplineRowKey: 'k-merge', name: 'Ada' };
    await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: [first], runId: config.runId,
    });
    await completeRuntimeMapRows(context(), {
      tableNamespace, sheetContract: contract, runId: config.runId,
      rows: [{ key: 'k-merge', data: { name: 'Ada', email: 'ada@a.example' } }],
    });
    const again = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract,
      rows: [{ ...first, company: 'A' }], runId: config.runId,
    });
    assert.deepEqual(again.completedRows, [
      { name: 'Ada', company: null, email: 'ada@a.example', __deeplineRowKey: 'k-merge' },
    ]);
    const rows = await dataset(tableNamespace).materialize();
    assert.deepEqual(rows, [{ name: 'Ada', company: null, email: 'ada@a.example' }]);
    return { tableNamespace, completedRows: again.completedRows };
  },

  async seedReadmitsAFailedRow() {
    // The failed row is among the rows to map again (the Python side checks
    // what the seed left stored).
    const sheet = config.failedSheet;
    const answer = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace: sheet.tableNamespace, sheetContract: contract,
      rows: sheet.inputRows, runId: `${config.runId}-again`,
    });
    assert.equal(answer.inserted, 0);
    assert.equal(answer.skipped, 3);
    assert.deepEqual(answer.pendingRows, sheet.inputRows);
    assert.deepEqual(answer.completedRows, []);
    assert.equal(key(sheet.inputRows[1]!, sheet.tableNamespace), sheet.failedKey);
    return { answer };
  },

  poolOptions: async () => ({ pools: runtimePoolRecords }),

  // Last: no row the runtime reads from a sheetplane sheet carries a column of
  // sheetplane's own. Its two versions live in `seq`, a name on the runtime's
  // system-column list (docs/parity.md, `isSystemSheetColumn`); every comparison
  // above is of whole rows, and this case reads the map sheet on every path.
  async versionColumnsInTheRuntimesRows() {
    const tableNamespace = await mapSheet();
    const answer = await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: MAP_INPUT, runId: config.runId,
    });
    const reads: Row[] = [
      ...(await dataset(tableNamespace).peek(5)),
      ...(await dataset(tableNamespace).materialize()),
      ...(await collect(dataset(tableNamespace))),
      ...answer.completedRows,
    ];
    assert.equal(reads.length, 5 * 3 + 2);
    for (const row of reads) {
      for (const name of ['seq', '_write_version', '_admitted_version']) {
        assert.ok(!(name in row), `a sheet row read by the runtime carries ${name}`);
      }
    }
    assert.deepEqual(await dataset(tableNamespace).materialize(), MAP_ROWS);
    return { rows: reads.length };
  },
};

// One map sheet the dataset cases share: five rows admitted, two completed.
const MAP_INPUT = Array.from({ length: 5 }, (_, index) => person(`M${index}`, 'M'));
const MAP_ROWS = MAP_INPUT.map((row, index) => ({
  ...row,
  email: index === 1 || index === 3 ? `m${index}@m.example` : null,
}));
let mapSheetReady: Promise<string> | null = null;

function mapSheet(): Promise<string> {
  mapSheetReady ??= (async () => {
    const tableNamespace = ns('map');
    await startRuntimeSheetDataset(context(), {
      playName: config.playName, tableNamespace, sheetContract: contract, rows: MAP_INPUT, runId: config.runId,
    });
    await completeRuntimeMapRows(context(), {
      tableNamespace, sheetContract: contract, runId: config.runId,
      rows: [1, 3].map((index) => ({ key: key(MAP_INPUT[index]!, tableNamespace), data: MAP_ROWS[index]! })),
    });
    return tableNamespace;
  })();
  return mapSheetReady;
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return `${error.name}${code ? ` ${String(code)}` : ''}: ${error.message}`;
  }
  return String(error);
}

function plain(value: unknown): unknown {
  return JSON.parse(JSON.stringify(value, (_key, item) => (typeof item === 'bigint' ? String(item) : item)));
}

async function main(): Promise<void> {
  const results: Record<string, unknown> = {};
  for (const [name, run] of Object.entries(cases)) {
    if (config.only && !config.only.includes(name)) continue;
    const started = Date.now();
    try {
      const detail = await run();
      results[name] = { ok: true, detail: plain(detail), ms: Date.now() - started };
    } catch (error) {
      results[name] = { ok: false, error: describe(error), ms: Date.now() - started };
    }
  }
  process.stdout.write(`${JSON.stringify({ cases: results })}\n`);
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${describe(error)}\n`);
    process.exit(1);
  },
);
