"""JSON Schemas as the grammar enforces them, and finished outputs checked against them.

`plan_json_schema` says which keywords the grammar enforces and rewrites the
schema it compiles; `check_output` validates a finished output against the
request's own schema. Both are pure, so the gateway and the executor agree.
"""

from radixmesh.schema.check import SchemaCheck, SchemaResult, check_output, schema_hash
from radixmesh.schema.plan import (
    SchemaPlan,
    Unenforced,
    check_enforceable,
    plan_json_schema,
    plan_schema_text,
)

__all__ = [
    "SchemaCheck",
    "SchemaPlan",
    "SchemaResult",
    "Unenforced",
    "check_enforceable",
    "check_output",
    "plan_json_schema",
    "plan_schema_text",
    "schema_hash",
]
