"""What the tests of scoped sessions share: a session answer's AAD, and SQL run as a role."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
import trio
from psycopg import sql

from sheetplane import crypto


def aad_of(answer: Mapping[str, Any]) -> bytes:
    """The AAD a ``create_db_session`` answer's envelope is bound to."""
    return crypto.session_aad(
        org_id=answer["target"]["orgId"],
        play_name=answer["playName"],
        table_namespace=answer["target"]["tableNamespace"],
        logical_table=answer["target"]["logicalTable"],
        operations=answer["operations"],
        expires_at=answer["expiresAt"],
    )


async def run_sql(url: str, statement: sql.Composable | str, params: Any = ()) -> Any:
    """One autocommit statement on a new connection to ``url`` (in a thread); its rows."""

    def work() -> Any:
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else None

    return await trio.to_thread.run_sync(work)
