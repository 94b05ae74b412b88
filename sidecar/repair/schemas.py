"""A route's ``schema``: an OpenAPI 3 document or a plain JSON Schema, from a file or a URL.

What comes out is always a plain, self-contained JSON Schema for one request body: local
``$ref``s inlined (a cycle becomes ``{}``, "anything"), and OpenAPI 3.0's ``nullable``
turned into a ``"null"`` type, so coercion and validation need to know only JSON Schema.
An OpenAPI ``discriminator`` names its branches by ``$ref``; as those are inlined, it gains
``x-branch-index``: each tag's position in the ``oneOf``/``anyOf`` list.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

# The discriminator member added by ``resolve``: tag → index of the branch it selects.
BRANCH_INDEX = "x-branch-index"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_MAX_REF_DEPTH = 32


class SchemaError(Exception):
    """A schema that cannot be loaded or read; the route then runs without one."""


def parse_document(text: bytes) -> dict[str, Any]:
    """JSON or YAML text into a mapping."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError:
        import yaml  # only a schema written in YAML needs it

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SchemaError("neither JSON nor YAML") from exc
    if not isinstance(document, dict):
        raise SchemaError("not a JSON/YAML mapping")
    return document


async def fetch_document(
    source: str, session: aiohttp.ClientSession, timeout_s: float
) -> dict[str, Any]:
    """The document at ``source``: an http(s) URL, or a file path."""
    if source.startswith(("http://", "https://")):
        try:
            async with session.get(
                source, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=True
            ) as response:
                if response.status != 200:
                    raise SchemaError(f"HTTP {response.status}")
                return parse_document(await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SchemaError(type(exc).__name__) from exc
    try:
        return parse_document(await asyncio.to_thread(Path(source).read_bytes))
    except OSError as exc:
        raise SchemaError(exc.strerror or type(exc).__name__) from exc


@dataclass(frozen=True, slots=True)
class _Operation:
    template: str
    pattern: re.Pattern[str]
    literal_segments: int
    body_schema: dict[str, Any] | None  # its JSON request body's, when it takes one


class RouteSchema:
    """Request-body schemas of one route, looked up by method and path."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self._plain: dict[str, Any] | None = None
        self._operations: dict[str, list[_Operation]] = {}
        if "openapi" in document and isinstance(document.get("paths"), dict):
            self._index_openapi(document)
        else:
            self._plain = resolve(document, document)

    def body_schema(self, method: str, path: str) -> dict[str, Any] | None:
        """The JSON Schema for a request body sent as ``method path``, if known."""
        if self._plain is not None:
            return self._plain
        operation = self._operation(method, path)
        return operation.body_schema if operation is not None else None

    def path_template(self, method: str, path: str) -> str | None:
        """The OpenAPI path template (``/items/{id}``) that ``method path`` matched, if any."""
        operation = self._operation(method, path)
        return operation.template if operation is not None else None

    def _operation(self, method: str, path: str) -> _Operation | None:
        for operation in self._operations.get(method.lower(), ()):
            if operation.pattern.fullmatch(path):
                return operation
        return None

    def _index_openapi(self, document: Mapping[str, Any]) -> None:
        base_paths = _server_paths(document)
        for template, item in document["paths"].items():
            if not isinstance(template, str) or not isinstance(item, dict):
                continue
            for method in _METHODS:
                operation = item.get(method)
                if not isinstance(operation, dict):
                    continue
                schema = _json_body_schema(operation, document)
                for base in base_paths:
                    self._operations.setdefault(method, []).append(
                        _Operation(
                            base + template,
                            _template_pattern(base + template),
                            template.count("/") - template.count("{"),
                            schema,
                        )
                    )
        for operations in self._operations.values():
            # A literal path (/items/latest) wins over a template (/items/{id}).
            operations.sort(key=lambda operation: -operation.literal_segments)


def _server_paths(document: Mapping[str, Any]) -> list[str]:
    """Path prefixes the tool serves under (from ``servers``), always including none."""
    prefixes = [""]
    servers = document.get("servers")
    for server in servers if isinstance(servers, list) else []:
        url = server.get("url") if isinstance(server, dict) else None
        if isinstance(url, str):
            path = re.sub(r"^[a-z]+://[^/]*", "", url).rstrip("/")
            if path.startswith("/") and path not in prefixes:
                prefixes.append(path)
    return prefixes


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^/{}]+\})", template)
    return re.compile(
        "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in parts) + "/?"
    )


def _json_body_schema(operation: Any, document: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(operation, dict):
        return None
    body = resolve(operation.get("requestBody"), document)
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, dict):
        return None
    for media_type, media in content.items():
        if "json" in str(media_type) and isinstance(media, dict):
            schema = media.get("schema")
            if isinstance(schema, dict):
                resolved = resolve(schema, document)
                return resolved if isinstance(resolved, dict) else None
    return None


def resolve(node: Any, document: Mapping[str, Any], active: frozenset[str] = frozenset()) -> Any:
    """``node`` with local ``$ref``s inlined and ``nullable`` made a ``"null"`` type.

    A reference to a schema that is being inlined already (a recursive type) becomes
    ``{}``: anything goes below that depth.
    """
    if isinstance(node, list):
        return [resolve(item, document, active) for item in node]
    if not isinstance(node, dict):
        return node
    reference = node.get("$ref")
    if isinstance(reference, str):
        target = _pointer(document, reference)
        if target is None or reference in active or len(active) >= _MAX_REF_DEPTH:
            return {}
        return resolve(target, document, active | {reference})
    resolved = {key: resolve(value, document, active) for key, value in node.items()}
    branch_index = _discriminator_branches(node)
    if branch_index:
        resolved["discriminator"] = {**resolved["discriminator"], BRANCH_INDEX: branch_index}
    if resolved.pop("nullable", False) is True and "type" in resolved:
        types = resolved["type"] if isinstance(resolved["type"], list) else [resolved["type"]]
        resolved["type"] = [*types, "null"]
    return resolved


def _discriminator_branches(node: Mapping[str, Any]) -> dict[str, int]:
    """Tag → branch index for a discriminated union whose branches are ``$ref``s.

    A tag is mapped by ``discriminator.mapping`` (to a ``$ref`` or a bare schema name), or
    else implicitly by the name of the schema a branch refers to, as OpenAPI defines.
    """
    discriminator = node.get("discriminator")
    branches = node.get("oneOf") or node.get("anyOf")
    if not isinstance(discriminator, dict) or not isinstance(branches, list):
        return {}
    refs = [branch.get("$ref") if isinstance(branch, dict) else None for branch in branches]
    index = {
        ref.rsplit("/", 1)[-1]: position
        for position, ref in enumerate(refs)
        if isinstance(ref, str)
    }
    mapping = discriminator.get("mapping")
    for tag, target in mapping.items() if isinstance(mapping, dict) else ():
        if isinstance(target, str):
            ref = target if "/" in target else f"#/components/schemas/{target}"
            if ref in refs:
                index[str(tag)] = refs.index(ref)
    return index


def _pointer(document: Mapping[str, Any], reference: str) -> Any:
    if not reference.startswith("#/"):
        return None
    node: Any = document
    for part in reference[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class SchemaStore:
    """Every route's schema: loaded at start, URLs refreshed; a failure keeps the last one."""

    def __init__(self, sources: Mapping[str, str | None], on_error: Callable[[str, str], None]):
        self._sources = {route: source for route, source in sources.items() if source}
        self._schemas: dict[str, RouteSchema] = {}
        self._on_error = on_error

    def body_schema(self, route: str, method: str, path: str) -> dict[str, Any] | None:
        schema = self._schemas.get(route)
        return schema.body_schema(method, path) if schema is not None else None

    def path_template(self, route: str, method: str, path: str) -> str | None:
        schema = self._schemas.get(route)
        return schema.path_template(method, path) if schema is not None else None

    async def load(
        self, session: aiohttp.ClientSession, timeout_s: float, *, urls_only: bool = False
    ) -> None:
        for route, source in self._sources.items():
            if urls_only and not source.startswith(("http://", "https://")):
                continue
            try:
                self._schemas[route] = RouteSchema(await fetch_document(source, session, timeout_s))
            except SchemaError as exc:
                self._on_error(route, str(exc))
            except (RecursionError, TypeError, ValueError) as exc:  # a document too odd to index
                self._on_error(route, type(exc).__name__)

    async def refresh_forever(
        self, session: aiohttp.ClientSession, timeout_s: float, interval_s: float
    ) -> None:
        """Reload the schemas that come from URLs every ``interval_s``; returns if none do."""
        if not any(source.startswith(("http://", "https://")) for source in self._sources.values()):
            return
        while True:
            await asyncio.sleep(interval_s)
            await self.load(session, timeout_s, urls_only=True)
