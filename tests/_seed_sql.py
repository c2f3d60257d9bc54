"""The seed's direct-road statements (0.1.2's ``runtime-api.ts``), by their SQL shape,
run through psycopg as a minted session: the regression test of the storage
contract and the session's rights, without node.

Each function builds the statement the seed builds for the same input (its
``$n`` parameters, through ``psycopg.RawCursor``; identifiers quoted as the seed
quotes them) and runs it on a connection of its own, autocommit, as the seed's
pool does: the ``ALTER TABLE`` first, then the write (in a transaction only
where the seed opens one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

#: The seed's ``isSystemSheetColumn``: what ``mapRuntimePostgresRow`` leaves out of data.
SEED_SYSTEM_COLUMNS = frozenset(
    {
        "_key",
        "_status",
        "_run_id",
        "_error",
        "_stage",
        "_provider",
        "_input_index",
        "_created_at",
        "_updated_at",
        "_cell_meta",
        "seq",
    }
)


def q(value: str) -> str:
    """The seed's ``quoteIdentifier``."""
    return '"' + value.replace('"', '""') + '"'


def lit(value: str) -> str:
    """The seed's ``quoteLiteral``."""
    return "'" + value.replace("'", "''") + "'"


class SeedSession:
    """One minted session's answer and URL, and the seed's statements on it."""

    def __init__(self, answer: Mapping[str, Any], url: str, contract: Mapping[str, Any]) -> None:
        self.answer = answer
        self.url = url
        self.contract = contract
        pg = answer["postgres"]
        self.schema = pg["schema"]
        self.rows = f"{q(pg['schema'])}.{q(pg['sheetTable'])}"
        self.events = f"{q(pg['schema'])}.{q(pg['eventTable'])}"
        self.summary = f"{q(pg['schema'])}.{q(pg['summaryTable'])}"
        self.colsum = f"{q(pg['schema'])}.{q(pg['columnSummaryTable'])}"
        self.play = answer["playName"]
        self.namespace = answer["target"]["tableNamespace"]

    # --- the seed's helpers ---------------------------------------------------------

    def projections(self) -> list[tuple[str, str]]:
        """``physicalSheetColumnProjections``: (sqlName, fieldName)."""
        seen: set[str] = set()
        out: list[tuple[str, str]] = []
        for column in self.contract["columns"]:
            name = column["sqlName"].strip()
            if not name or name.startswith("_") or name in seen:
                continue
            seen.add(name)
            source = column.get("source")
            field = (
                (column.get("field") or "").strip() or column["id"].strip() or name
                if source in ("input", "mapField")
                else name
            )
            out.append((name, field))
        return out

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, cursor_factory=psycopg.RawCursor)

    def alter(self, conn: psycopg.Connection[Any], extra: Sequence[str] = ()) -> None:
        """``ensureRuntimePhysicalSheetColumns`` (``extra``: names beyond the contract's)."""
        names = [name for name, _ in self.projections()] + list(extra)
        if not names:
            return
        adds = ",\n    ".join(f"ADD COLUMN IF NOT EXISTS {q(n)} jsonb" for n in names)
        conn.execute(f"\n    ALTER TABLE {self.rows}\n    {adds}\n  ")

    # --- startRuntimeSheetDataset ---------------------------------------------------

    def start(self, rows: Sequence[Mapping[str, Any]], run_id: str) -> dict[str, Any]:
        """The seed's admission: one chunk (every test input is under 5,000 rows)."""
        unique: dict[str, dict[str, Any]] = {}
        for row in rows:
            cleaned = {k: v for k, v in row.items() if k != "__deeplineRowKey"}
            key = row["__deeplineRowKey"]
            if key and key not in unique:
                unique[key] = cleaned
        entries = list(unique.items())
        names = [name for name, _ in self.projections()]
        cols = "".join(f", {q(n)}" for n in names)
        vals = "".join(f", payload -> {lit(n)}" for n in names)
        statement = f"""
            WITH input_rows AS (
              SELECT key_values._key, payload_values.payload, index_values._input_index
              FROM unnest($1::text[]) WITH ORDINALITY AS key_values(_key, ord)
              JOIN unnest($2::jsonb[]) WITH ORDINALITY AS payload_values(payload, ord)
                ON payload_values.ord = key_values.ord
              JOIN unnest($3::bigint[]) WITH ORDINALITY AS index_values(_input_index, ord)
                ON index_values.ord = key_values.ord
            ),
            existing_rows AS (
              UPDATE {self.rows} AS target
              SET _input_index = input_rows._input_index
              FROM input_rows
              WHERE target._key = input_rows._key
                AND target._input_index IS DISTINCT FROM input_rows._input_index
              RETURNING target._key
            ),
            inserted_rows AS (
              INSERT INTO {self.rows} (_key, _status, _run_id, _input_index{cols})
              SELECT _key, 'pending', $4, _input_index{vals}
              FROM input_rows
              ON CONFLICT (_key) DO UPDATE SET
                _status = 'pending',
                _run_id = EXCLUDED._run_id,
                _input_index = EXCLUDED._input_index
              WHERE {self.rows}._status = 'stale'
              RETURNING _key
            ),
            inserted_events AS (
              INSERT INTO {self.events} (play_name, table_namespace, _key, _status, _run_id, _stage, data_patch)
              SELECT $5, $6, _key, 'pending', $4, 'queued', payload
              FROM input_rows
              WHERE _key = ANY(SELECT _key FROM inserted_rows)
              RETURNING 1
            ),
            pending_rows AS (
              SELECT _key
              FROM inserted_rows
              UNION
              SELECT existing._key
              FROM {self.rows} AS existing
              JOIN input_rows ON input_rows._key = existing._key
              WHERE existing._status IN ('pending', 'running', 'failed')
            ),
            inserted_count_cte AS (
              SELECT count(*)::bigint AS c FROM inserted_rows
            ),
            summary_upsert AS (
              INSERT INTO {self.summary} (play_name, table_namespace, total, queued, running, completed, failed)
              SELECT $5, $6, c, c, 0, 0, 0
                FROM inserted_count_cte
               WHERE c > 0
              ON CONFLICT (play_name, table_namespace) DO UPDATE SET
                total = {self.summary}.total + EXCLUDED.total,
                queued = {self.summary}.queued + EXCLUDED.queued,
                _updated_at = now()
              RETURNING 1
            )
            SELECT
              (SELECT c::int FROM inserted_count_cte) AS inserted_count,
              coalesce((SELECT array_agg(_key) FROM pending_rows), '{{}}'::text[]) AS pending_keys,
              (SELECT count(*)::int FROM existing_rows) AS reordered_count,
              (SELECT count(*)::int FROM inserted_events) AS event_count
        """  # noqa: E501
        with self.connect() as conn:
            self.alter(conn)
            row = conn.execute(
                statement,
                [
                    [k for k, _ in entries],
                    [json.dumps(r) for _, r in entries],
                    list(range(len(entries))),
                    run_id,
                    self.play,
                    self.namespace,
                ],
            ).fetchone()
            assert row is not None
            inserted, pending_keys = int(row[0]), list(row[1])
            completed_keys = [k for k, _ in entries if k not in set(pending_keys)]
            by_key = {r["key"]: r["data"] for r in self.read_by_keys(conn, completed_keys)}
        return {
            "inserted": inserted,
            "skipped": len(entries) - inserted + (len(rows) - len(entries)),
            "pendingKeys": [k for k, _ in entries if k in set(pending_keys)],
            "completedRows": [
                {**merge_completed(r, by_key.get(k, {}), self.contract), "__deeplineRowKey": k}
                for k, r in entries
                if k not in set(pending_keys)
            ],
        }

    # --- completeRuntimeMapRows -----------------------------------------------------

    def complete(self, rows: Sequence[Mapping[str, Any]], run_id: str) -> int:
        unique: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for row in rows:
            unique[row["key"]] = row["data"]
            if row.get("cellMetaPatch"):
                meta[row["key"]] = row["cellMetaPatch"]
        sets = "".join(
            f",\n        {q(n)} = CASE\n"
            f"          WHEN coalesce(updates.data_patch, '{{}}'::jsonb) ? {lit(f)}\n"
            f"            THEN updates.data_patch -> {lit(f)}\n"
            f"          ELSE target.{q(n)}\n        END"
            for n, f in self.projections()
        )
        statement = f"""WITH updates AS (
             SELECT * FROM jsonb_to_recordset($1::jsonb) AS incoming(
               key text,
               data_patch jsonb,
               cell_meta_patch jsonb
             )
           ),
           applied_rows AS (
             UPDATE {self.rows} AS target
             SET _status = 'enriched',
                 _run_id = $4,
                 _error = NULL,
                 _updated_at = now(),
                 _cell_meta = coalesce(target._cell_meta, '{{}}'::jsonb)
                   || coalesce(updates.cell_meta_patch, '{{}}'::jsonb){sets}
             FROM updates
             WHERE target._key = updates.key
             RETURNING target._key
           ),
           inserted_events AS (
             INSERT INTO {self.events}
               (play_name, table_namespace, _key, _status, _run_id, _stage, data_patch)
             SELECT $2, $3, updates.key, 'enriched', $4, 'completed',
                    coalesce(updates.data_patch, '{{}}'::jsonb)
             FROM updates
             WHERE updates.key = ANY(SELECT _key FROM applied_rows)
             RETURNING 1
           )
           SELECT _key FROM applied_rows"""
        chunk = [
            {"key": k, "data_patch": d, "cell_meta_patch": meta.get(k, {})}
            for k, d in unique.items()
        ]
        with self.connect() as conn:
            self.alter(conn)
            applied = conn.execute(
                statement, [json.dumps(chunk), self.play, self.namespace, run_id]
            ).fetchall()
        return len(applied)

    # --- writeRuntimeRows (upsert, append, replace) ---------------------------------

    def write(
        self,
        rows: Sequence[Mapping[str, Any]],
        run_id: str,
        mode: str,
        idempotency_key: str,
        identity: Any,
    ) -> int:
        """``writeRuntimeRows``; ``identity(row)`` is the seed's ``derivePlayRowIdentity``."""
        projections = self.projections()
        cols = "".join(f", {q(n)}" for n, _ in projections)
        vals = "".join(f", payload -> {lit(f)}" for _, f in projections)
        if mode == "upsert":
            unique: dict[str, Mapping[str, Any]] = {}
            for row in rows:
                key = identity(row)
                if key and key not in unique:
                    unique[key] = row
            entries = [(k, r, i) for i, (k, r) in enumerate(unique.items())]
        else:
            entries = [
                (append_key(identity(r), idempotency_key, i), r, i) for i, r in enumerate(rows)
            ]
        computes = mode in ("append", "replace")
        starting = (
            f"starting_index AS (\n SELECT coalesce(max(_input_index), -1)::bigint AS v"
            f" FROM {self.rows}\n),"
            if computes
            else ""
        )
        index_expr = (
            "(SELECT v FROM starting_index) + index_values._input_index::bigint + 1"
            if computes
            else "index_values._input_index::bigint"
        )
        conflict = (
            f"""ON CONFLICT (_key) DO UPDATE SET
                  _status = 'pending',
                  _run_id = EXCLUDED._run_id,
                  _input_index = EXCLUDED._input_index
                WHERE {self.rows}._status = 'stale'"""
            if mode == "upsert"
            else ""
        )
        events_where = (
            "WHERE _key = ANY(SELECT _key FROM inserted_rows)" if mode == "upsert" else ""
        )
        statement = f"""
          WITH {starting}
          input_rows AS (
            SELECT key_values._key, payload_values.payload,
                   {index_expr} AS _input_index
            FROM unnest($1::text[]) WITH ORDINALITY AS key_values(_key, ord)
            JOIN unnest($2::jsonb[]) WITH ORDINALITY AS payload_values(payload, ord)
              ON payload_values.ord = key_values.ord
            JOIN unnest($3::bigint[]) WITH ORDINALITY AS index_values(_input_index, ord)
              ON index_values.ord = key_values.ord
          ),
          inserted_rows AS (
            INSERT INTO {self.rows} (_key, _status, _run_id, _input_index{cols})
            SELECT _key, 'pending', $4, _input_index{vals}
            FROM input_rows
            {conflict}
            RETURNING _key
          ),
          inserted_events AS (
            INSERT INTO {self.events} (play_name, table_namespace, _key, _status, _run_id, _stage, data_patch)
            SELECT $5, $6, _key, 'pending', $4, 'queued', payload
            FROM input_rows
            {events_where}
            RETURNING 1
          ),
          inserted_count_cte AS (
            SELECT count(*)::bigint AS c FROM inserted_rows
          ),
          summary_upsert AS (
            INSERT INTO {self.summary} (play_name, table_namespace, total, queued, running, completed, failed)
            SELECT $5, $6, c, c, 0, 0, 0
              FROM inserted_count_cte
             WHERE c > 0
            ON CONFLICT (play_name, table_namespace) DO UPDATE SET
              total = {self.summary}.total + EXCLUDED.total,
              queued = {self.summary}.queued + EXCLUDED.queued,
              _updated_at = now()
            RETURNING 1
          )
          SELECT c::int AS inserted_count FROM inserted_count_cte
        """  # noqa: E501
        params = [
            [k for k, _, _ in entries],
            [json.dumps(r) for _, r, _ in entries],
            [i for _, _, i in entries],
            run_id,
            self.play,
            self.namespace,
        ]
        with self.connect() as conn:
            self.alter(conn)
            if mode == "replace":
                conn.execute("BEGIN")
                conn.execute(
                    f"""WITH cleared_sheet AS (
                     DELETE FROM {self.rows} RETURNING 1
                   ),
                   cleared_events AS (
                     DELETE FROM {self.events}
                     WHERE play_name = $1 AND table_namespace = $2
                     RETURNING 1
                   ),
                   reset_summary AS (
                     UPDATE {self.summary}
                        SET total = 0, queued = 0, running = 0, completed = 0, failed = 0, _updated_at = now()
                      WHERE play_name = $1 AND table_namespace = $2
                      RETURNING 1
                   ),
                   cleared_col_summary AS (
                     DELETE FROM {self.colsum}
                     WHERE play_name = $1 AND table_namespace = $2
                     RETURNING 1
                   )
                   SELECT 1""",  # noqa: E501
                    [self.play, self.namespace],
                )
            row = conn.execute(statement, params).fetchone()
            if mode == "replace":
                conn.execute("COMMIT")
        assert row is not None
        return int(row[0])

    # --- reads ----------------------------------------------------------------------

    def read_by_keys(self, conn: psycopg.Connection[Any], keys: list[str]) -> list[dict[str, Any]]:
        if not keys:
            return []
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cur.execute(
            f"SELECT *\n FROM {self.rows}\n WHERE _key = ANY($1::text[])\n"
            " ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC",
            [keys],
        ).fetchall()
        return [map_row(r) for r in rows]

    def read(self, limit: int, offset: int) -> list[dict[str, Any]]:
        """``readRuntimeRows``: mapped rows (key, data, inputIndex)."""
        with self.connect() as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            rows = cur.execute(
                f"SELECT *\n FROM {self.rows}\n"
                " ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC\n"
                " LIMIT $1 OFFSET $2",
                [limit, offset],
            ).fetchall()
        return [map_row(r) for r in rows]

    def count(self) -> int:
        """``readRuntimeSummary``'s total."""
        with self.connect() as conn:
            row = conn.execute(
                f"SELECT total\n FROM {self.summary}\n"
                " WHERE play_name = $1 AND table_namespace = $2\n LIMIT 1",
                [self.play, self.namespace],
            ).fetchone()
        return int(row[0]) if row else 0


def map_row(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``mapRuntimePostgresRow``."""
    return {
        "key": str(raw.get("_key") or ""),
        "data": {k: v for k, v in raw.items() if k not in SEED_SYSTEM_COLUMNS},
        "inputIndex": int(raw["_input_index"]) if raw.get("_input_index") is not None else None,
    }


def merge_completed(
    input_row: Mapping[str, Any], completed: Mapping[str, Any], contract: Mapping[str, Any]
) -> dict[str, Any]:
    """``mergeRuntimeCompletedRow``."""
    synthetic = {
        c["field"]
        for c in contract["columns"]
        if c.get("source") == "input"
        and isinstance(c.get("field"), str)
        and c["field"] not in input_row
        and completed.get(c["field"]) is None
    }
    return {**input_row, **{k: v for k, v in completed.items() if k not in synthetic}}


def append_key(base: str, idempotency_key: str, ordinal: int) -> str:
    """``buildAppendedRowKey``."""
    digest = hashlib.sha1(f"{idempotency_key}:{ordinal}".encode()).hexdigest()[:12]
    return f"{base}:append:{digest}"
