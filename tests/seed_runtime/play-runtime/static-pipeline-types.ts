// Stand-in for the runtime's `./static-pipeline-types`: the shapes runtime-api.ts
// reads (`sheetContract.columns[].{id, sqlName, source, field}`, a pipeline's
// `tableNamespace`, `sheetContract`, `stages` and `substeps`).

export type PlaySheetColumn = {
  id: string;
  sqlName: string;
  source: 'input' | 'mapField' | 'output';
  field?: string | null;
};

export type PlaySheetContract = {
  columns: PlaySheetColumn[];
};

export type PlayStaticPipelineSubstep = {
  type: string;
  tableNamespace?: string | null;
  sheetContract?: PlaySheetContract | null;
};

export type PlayStaticPipeline = {
  tableNamespace?: string | null;
  sheetContract?: PlaySheetContract | null;
  stages?: PlayStaticPipelineSubstep[];
  substeps: PlayStaticPipelineSubstep[];
};
