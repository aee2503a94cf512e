"""Check staff-written JSON schemas and model answers against them, with readable errors."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import Draft202012Validator, validator_for

__all__ = ["schema_errors", "instance_errors", "json_path", "unresolvable_refs"]

# Messages quote the offending value; a rambling answer must not produce a page of error.
_MAX_MESSAGE = 200


def json_path(parts: Iterable[object]) -> str:
    """Render a jsonschema path as `$.a[0]` because staff and the model both read it."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def schema_errors(schema: object) -> list[str]:
    """Errors in the schema itself, so a bad schema is refused on save, not at answer time."""
    if not isinstance(schema, (dict, bool)):
        return [f"$: a JSON schema must be an object or a boolean, not {type(schema).__name__}"]
    cls = _validator_class(schema)
    if cls is None and isinstance(schema, dict):
        # jsonschema only warns today and will raise later; refuse it now, readably.
        return [f"$.$schema: unknown JSON schema dialect {schema['$schema']!r}"]
    assert cls is not None  # only a $schema names an unknown dialect
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        # check_schema reports one error; staff fixing a schema want all of them.
        meta_cls = validator_for(cls.META_SCHEMA, default=cls)
        meta = meta_cls(cls.META_SCHEMA, format_checker=meta_cls.FORMAT_CHECKER)
        found = [_format(error) for error in _sorted(meta.iter_errors(schema))]
        return found or [_format(exc)]
    return []


def unresolvable_refs(schema: object) -> list[str]:
    """Each `$ref` in `schema` that does not resolve within it (nothing is fetched: a remote
    reference never resolves), so a schema that cannot be applied is refused up front."""
    from referencing import Registry, Resource
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    if not isinstance(schema, dict):
        return []
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    resolver = Registry().with_resource("", resource).resolver(base_uri="")
    found = []
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            found.append(ref)
    return found


def _refs(value: object) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def instance_errors(value: object, schema: object) -> list[str]:
    """All ways `value` breaks `schema`, ordered by path, e.g. "$.answer: ... required"."""
    cls = _validator_class(schema) or Draft202012Validator
    # Formats are only annotations by default; an answer schema saying "email" means it.
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        return [_format(error) for error in _sorted(validator.iter_errors(value))]
    except Exception as exc:  # noqa: BLE001 - e.g. an unresolvable $ref; report, don't crash
        return [f"$: the schema could not be applied: {exc}"]


def _validator_class(schema: object) -> type[Validator] | None:
    """The dialect's validator class; None for an unknown $schema (instead of a warning)."""
    if isinstance(schema, dict) and "$schema" in schema:
        found: type[Validator] | None = validator_for(schema, default=None)
        return found
    default: type[Validator] = Draft202012Validator  # built at import, so typed Any
    return default


def _sorted(errors: Iterable[ValidationError]) -> list[ValidationError]:
    """Stable order by path then message, so reasons are reproducible run to run."""
    return sorted(errors, key=lambda error: (_path_key(_path(error)), error.message))


def _path_key(parts: Sequence[object]) -> list[tuple[int, str]]:
    """Sort key for mixed int/str paths, which Python cannot compare directly."""
    return [(0, f"{part:010d}") if isinstance(part, int) else (1, str(part)) for part in parts]


def _path(error: ValidationError) -> list[object]:
    """Where the error is; a missing property is reported at the property, not its parent."""
    parts = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        for name in error.validator_value:
            if name not in error.instance and error.message.startswith(repr(name)):
                parts.append(name)
                break
    return parts


def _format(error: ValidationError) -> str:
    """One line: path, colon, jsonschema's message (trimmed)."""
    message = error.message
    if len(message) > _MAX_MESSAGE:
        # The bulk is nearly always the quoted value; shorten it, keep what is wrong.
        quoted = repr(error.instance)
        if message.startswith(quoted):
            message = quoted[:40] + "..." + message[len(quoted) :]
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
    return f"{json_path(_path(error))}: {message}"
