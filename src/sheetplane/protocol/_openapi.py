"""The OpenAPI 3.1 document of the runtime route, generated from the wire classes.

Nothing here is written by hand but the statuses: every schema comes from an
attrs class of ``protocol/_messages.py`` (field types, wire names, which
members are required, the bounds the converter enforces), so the document
cannot drift from what the client and the server read and write. The request
body is a ``oneOf`` of every action's request, discriminated by ``action``;
the 200 answer is ``anyOf`` every action's answer (each action's own answer
is named in its request schema's ``x-answer``); every error status has the
error body.

The operating routes are described too, from their own answer classes:
``GET /healthz`` (:class:`HealthAnswer`), ``GET /readyz`` (:class:`ReadyAnswer`,
503 :class:`UnreadyAnswer` or, while draining, the error body) and ``GET
/metrics`` (the Prometheus text format, behind the metrics token).

The reference gateway serves it at ``GET {RUNTIME_PATH}/openapi.json``;
``sheetplane openapi`` prints it.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Final, Literal

import attrs

from . import _messages
from ._errors import status_descriptions
from ._messages import (
    ANSWERS,
    REQUESTS,
    Absent,
    ErrorBody,
    HealthAnswer,
    ReadyAnswer,
    UnreadyAnswer,
    wire_name,
)
from ._wire import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, RUNTIME_PATH

__all__ = [
    "ERROR_STATUSES",
    "OPENAPI_PATH",
    "json_of",
    "openapi_document",
]

#: Where the reference gateway serves the document.
OPENAPI_PATH: Final = RUNTIME_PATH + "/openapi.json"

#: Every error status the gateway answers, and when: read off the error table.
ERROR_STATUSES: Final = status_descriptions()


def _component(cls: type[Any]) -> str:
    return f"#/components/schemas/{cls.__name__}"


class _Builder:
    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def ref(self, cls: type[Any]) -> dict[str, Any]:
        if cls.__name__ not in self.schemas:
            self.schemas[cls.__name__] = {}  # a placeholder: classes may refer to each other
            self.schemas[cls.__name__] = self._class(cls)
        return {"$ref": _component(cls)}

    def _class(self, cls: type[Any]) -> dict[str, Any]:
        fields = attrs.fields(attrs.resolve_types(cls, vars(_messages)))
        properties: dict[str, Any] = {}
        required: list[str] = []
        for field in fields:
            schema = self.type(field.type)
            for key in ("minLength", "pattern", "minimum", "maximum", "minItems", "maxItems"):
                value = field.metadata.get(key)
                if value is not None:
                    schema = self._constrain(schema, key, value)
            properties[wire_name(field)] = schema
            if field.default is attrs.NOTHING:
                required.append(wire_name(field))
        out: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            out["required"] = required
        if cls in _messages.CLOSED:
            out["additionalProperties"] = False
        if cls.__doc__:
            out["description"] = cls.__doc__.strip().splitlines()[0]
        return out

    @staticmethod
    def _constrain(schema: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
        if "anyOf" in schema:  # nullable: the bound applies to the non-null branch
            first, *rest = schema["anyOf"]
            return {**schema, "anyOf": [{**first, key: value}, *rest]}
        return {**schema, key: value}

    def type(self, tp: Any) -> dict[str, Any]:
        origin: Any = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp is Any:
            return {}
        if tp is str:
            return {"type": "string"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if origin is Literal:
            return {"enum": list(args)}
        if origin is list:
            return {"type": "array", "items": self.type(args[0])}
        if origin is dict:
            value = self.type(args[1])
            return (
                {"type": "object", "additionalProperties": value} if value else {"type": "object"}
            )
        if origin in (typing.Union, types.UnionType):
            members = [a for a in args if a not in (type(None), Absent)]
            (inner,) = members
            schema = self.type(inner)
            if type(None) in args:
                return {"anyOf": [schema, {"type": "null"}]}
            return schema
        if attrs.has(tp):
            return self.ref(tp)
        raise TypeError(f"no JSON Schema for {tp!r}")


def json_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _probe_paths(builder: _Builder, error: dict[str, Any]) -> dict[str, Any]:
    """``GET /healthz``, ``/readyz`` and ``/metrics``, their answers from their classes."""
    draining = {"description": "The gateway is draining", "content": json_of(error)}
    return {
        HEALTHZ_PATH: {
            "get": {
                "operationId": "healthz",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The process serves (also while it drains)",
                        "content": json_of(builder.ref(HealthAnswer)),
                    }
                },
            }
        },
        READYZ_PATH: {
            "get": {
                "operationId": "readyz",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The store answers within the readiness budget",
                        "content": json_of(builder.ref(ReadyAnswer)),
                    },
                    "503": {
                        "description": "The store did not answer in time, or the gateway "
                        "is draining (the error body)",
                        "content": json_of({"anyOf": [builder.ref(UnreadyAnswer), error]}),
                    },
                },
            }
        },
        METRICS_PATH: {
            "get": {
                "operationId": "metrics",
                "security": [{"metricsToken": []}],
                "responses": {
                    "200": {
                        "description": "The Prometheus text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": {
                        "description": "A missing or wrong metrics token",
                        "content": json_of(error),
                    },
                    "404": {
                        "description": "This gateway has no metrics token (metrics are off)",
                        "content": json_of(error),
                    },
                    "503": draining,
                },
            }
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``POST RUNTIME_PATH``, as a JSON-ready dict."""
    builder = _Builder()
    requests = []
    mapping = {}
    for action, cls in REQUESTS.items():
        ref = builder.ref(cls)
        answer = builder.ref(ANSWERS[action])
        builder.schemas[cls.__name__]["x-answer"] = answer["$ref"]
        requests.append(ref)
        mapping[action] = ref["$ref"]
    answers = [builder.ref(cls) for cls in dict.fromkeys(ANSWERS.values())]
    error = builder.ref(ErrorBody)
    responses: dict[str, Any] = {
        "200": {
            "description": "The action's answer (the x-answer of its request schema)",
            "content": json_of({"anyOf": answers}),
        }
    }
    for status, why in ERROR_STATUSES.items():
        responses[status] = {"description": why, "content": json_of(error)}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sheetplane runtime gateway",
            "version": "2",
            "description": "The runtime data plane: every action is a POST of "
            "{action, playName, ...} to one route, authorized by an executor token.",
        },
        "paths": {
            RUNTIME_PATH: {
                "post": {
                    "operationId": "runtimeAction",
                    "security": [{"executorToken": []}],
                    "requestBody": {
                        "required": True,
                        "content": json_of(
                            {
                                "oneOf": requests,
                                "discriminator": {"propertyName": "action", "mapping": mapping},
                            }
                        ),
                    },
                    "responses": responses,
                }
            },
            OPENAPI_PATH: {
                "get": {
                    "operationId": "openapiDocument",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "This document",
                            "content": json_of({"type": "object"}),
                        }
                    },
                }
            },
            **_probe_paths(builder, error),
        },
        "components": {
            "schemas": builder.schemas,
            "securitySchemes": {
                "executorToken": {"type": "http", "scheme": "bearer"},
                "metricsToken": {"type": "http", "scheme": "bearer"},
            },
        },
    }
