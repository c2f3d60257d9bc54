// Stand-in for the runtime's `../plays/dataset`, written from the one call site
// in runtime-api.ts: `createDeferredPlayDataset({datasetKind, datasetId, count,
// previewRows, sourceLabel, backing?, tableNamespace?, resolvers: {count, peek,
// materialize, iterate}})`. The dataset hands each operation to its resolver;
// `count` is the resolver's answer (the initial count is only a descriptor).

export type PlayDatasetBacking = {
  storage: string;
  sheet: { playName: string; tableNamespace: string };
};

export type PlayDatasetResolvers<T> = {
  count: () => Promise<number>;
  peek: (limit: number) => Promise<T[]>;
  materialize: (limit?: number) => Promise<T[]>;
  iterate: () => AsyncIterable<T>;
};

export type PlayDataset<T> = AsyncIterable<T> & {
  readonly datasetKind: 'csv' | 'map';
  readonly datasetId: string;
  readonly initialCount: number;
  readonly previewRows: T[];
  readonly sourceLabel: string | null;
  readonly backing: PlayDatasetBacking | null;
  readonly tableNamespace: string | null;
  count(): Promise<number>;
  peek(limit: number): Promise<T[]>;
  materialize(limit?: number): Promise<T[]>;
};

export function createDeferredPlayDataset<T>(input: {
  datasetKind: 'csv' | 'map';
  datasetId: string;
  count: number;
  previewRows: T[];
  sourceLabel: string | null;
  backing?: PlayDatasetBacking;
  tableNamespace?: string;
  resolvers: PlayDatasetResolvers<T>;
}): PlayDataset<T> {
  return {
    datasetKind: input.datasetKind,
    datasetId: input.datasetId,
    initialCount: input.count,
    previewRows: [...input.previewRows],
    sourceLabel: input.sourceLabel,
    backing: input.backing ?? null,
    tableNamespace: input.tableNamespace ?? null,
    count: () => input.resolvers.count(),
    peek: (limit: number) => input.resolvers.peek(limit),
    materialize: (limit?: number) => input.resolvers.materialize(limit),
    [Symbol.asyncIterator]: () =>
      input.resolvers.iterate()[Symbol.asyncIterator](),
  };
}
