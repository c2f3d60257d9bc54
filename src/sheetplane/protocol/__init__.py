"""The runtime gateway's protocol, both sides of it, without I/O.

The client (``sheetplane.gateway.client``), the reference server
(``sheetplane.gateway.server``), the sessions, the conformance checks and
the test strategies all speak the wire through this package, so the two
sides agree by construction rather than by copy:

* ``_wire``: the vocabulary (the routes, the actions, the error codes, the
  enumerations) and the body codec;
* ``_converter``: the one cattrs converter and the field rules;
* ``_messages``: every request and answer as an attrs class;
* ``_domain``: domain values to wire messages and back, both directions;
* ``_errors``: the error table (code, status, exception, retryable);
* ``_receive``: what one answer means (answer, retry or raise), as a pure function;
* ``_splice``: bodies built around bytes already encoded, and their overheads;
* ``_chunks``: the staged chunk codec (input rows checked, keyed and encoded once);
* ``_openapi``: the OpenAPI 3.1 document, generated from the classes and the table.

Importing it imports neither httpx, starlette, hypercorn nor psycopg (a test
checks ``sys.modules``).
"""

from ._chunks import ChunkBuilder as ChunkBuilder
from ._chunks import EncodedChunk as EncodedChunk
from ._chunks import encode_row as encode_row
from ._chunks import prepare_chunk as prepare_chunk

__all__ = ["ChunkBuilder", "EncodedChunk", "encode_row", "prepare_chunk"]
