"""pydantic JSON Schema -> Kubernetes structural OpenAPI v3 schema.

The API server only accepts structural schemas: every node typed, no $ref, null expressed
as `nullable`, no `additionalProperties` beside `properties`, no `const`/`uniqueItems`, and
defaults that it can apply level by level. pydantic emits JSON Schema 2020-12, so this
module rewrites it; anything it cannot express raises instead of producing a schema the
server would reject or, worse, silently prune.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

Schema = dict[str, Any]

_DROPPED = ("title", "uniqueItems", "$defs")
_NULL = {"type": "null"}


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also emits defaults that come from a default_factory (pydantic leaves them out)."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()  # type: ignore[call-arg]
        return schema.get("default", NoDefault)


def pydantic_schema(model: type[BaseModel]) -> Schema:
    """The model's JSON Schema by wire names, factory defaults included."""
    return model.model_json_schema(by_alias=True, schema_generator=_WithFactoryDefaults)


def structural(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model`."""
    raw = pydantic_schema(model)
    return _convert(raw, raw.get("$defs", {}), path="")


def _convert(node: Schema, defs: dict[str, Schema], path: str) -> Schema:
    node = copy.deepcopy(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**_convert(target, defs, path), **node}
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise ValueError(f"{path or '(root)'}: allOf with several parts is not structural")
        node = {**_convert(parts[0], defs, path), **node}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = node.pop("anyOf")
        concrete = [option for option in options if option != _NULL]
        if len(concrete) != 1:
            raise ValueError(f"{path or '(root)'}: a union of several types is not structural")
        node = {**_convert(concrete[0], defs, path), **node}
        if len(concrete) < len(options):
            node["nullable"] = True
    for key in _DROPPED:
        node.pop(key, None)
    if "description" in node:
        node["description"] = _reflow(node["description"])
    if node.get("additionalProperties") is False or node.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        node.pop("additionalProperties", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[inclusive] = node[bound]
            node[bound] = True
    if "prefixItems" in node:
        node["items"] = _homogeneous(node.pop("prefixItems"), defs, path)
    if "properties" in node:
        node["properties"] = {
            name: _convert(child, defs, f"{path}.{name}")
            for name, child in node["properties"].items()
        }
    if isinstance(node.get("items"), dict):
        node["items"] = _convert(node["items"], defs, f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        if "properties" in node:
            raise ValueError(f"{path}: properties and additionalProperties cannot be combined")
        node["additionalProperties"] = _convert(node["additionalProperties"], defs, f"{path}.*")
    if node.get("x-kubernetes-int-or-string"):
        node["anyOf"] = [_convert(option, defs, path) for option in node["anyOf"]]
    if "default" in node:
        _structural_default(node)
    if "type" not in node and not (
        node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    ):
        raise ValueError(f"{path or '(root)'}: every node of a structural schema needs a type")
    return node


def _reflow(text: str) -> str:
    """Docstring line breaks are source formatting; only blank lines separate paragraphs."""
    paragraphs = text.strip().split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _homogeneous(items: list[Schema], defs: dict[str, Schema], path: str) -> Schema:
    converted = [_convert(item, defs, f"{path}[]") for item in items]
    if any(item != converted[0] for item in converted):
        raise ValueError(f"{path}: a tuple of different types is not structural")
    return converted[0]


def _structural_default(node: Schema) -> None:
    """Shrinks a default to what the server cannot derive from the nested defaults itself.

    The server applies defaults level by level, so a parent object needs only `{}` plus the
    keys whose default differs from what its own children's defaults would produce; null
    defaults are dropped because an absent optional field already means null.
    """
    default = _without_nulls(node["default"])
    if default is None:
        del node["default"]
        return
    if node.get("type") == "object" and isinstance(default, dict):
        # The server checks a default against the object's CEL rules as written, before
        # nested defaults apply, so an object with rules keeps its complete default.
        if "x-kubernetes-validations" not in node:
            default = _minimal(node, default)
    elif isinstance(default, list) and node.get("items", {}).get("type") == "object":
        default = [_minimal(node["items"], item) for item in default]
    node["default"] = default


def _minimal(schema: Schema, default: dict[str, Any]) -> dict[str, Any]:
    implied = apply_defaults(schema, {})
    return {key: value for key, value in default.items() if implied.get(key) != value}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def without_defaults(node: Any) -> Any:
    """`node` with every default removed, at every level: what it leaves out stays out in the
    stored object (a job's inherited fields, a policy's partial defaults)."""
    if isinstance(node, list):
        return [without_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: without_defaults(value) for key, value in node.items() if key != "default"}


def apply_defaults(schema: Schema, value: Any) -> Any:
    """What the API server stores for `value`: defaults of absent fields, level by level.

    Used to compute minimal defaults here, and by tests to predict what the server returns.
    """
    if isinstance(value, dict) and schema.get("type") == "object":
        result = dict(value)
        for name, child in schema.get("properties", {}).items():
            if name not in result and "default" in child:
                result[name] = copy.deepcopy(child["default"])
            if name in result:
                result[name] = apply_defaults(child, result[name])
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value
