"""``tool-retry-sidecar inject``: Kubernetes manifests in, the same with the sidecar added out.

Like ``linkerd inject`` it is a text transform: it reads a file or ``-`` (standard input),
writes the manifests to standard output for ``kubectl apply -f -``, and says on standard
error what it did to each resource. Every pod template of a Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job, CronJob or Pod (also inside a ``List``) gets the sidecar; any
other document, and any document it leaves unchanged, is written back byte for byte.
``--uninject`` takes out exactly what ``inject`` added.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import LiteralScalarString

from sidecar.config import ConfigError, load_settings
from sidecar.inject.args import CONFIG_KEY
from sidecar.inject.container import SIDECAR_NAME, Sidecar
from sidecar.inject.pod import (
    InjectError,
    Skip,
    add,
    has_foreign_sidecar,
    read_status,
    remove,
)
from sidecar.inject.yamltext import (
    Document,
    ManifestError,
    join,
    new_document,
    plain,
    split,
    stream_style,
)

EXIT_INPUT_ERROR = 1
EXIT_CONFIG_ERROR = 2
WORKLOAD_KINDS = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}
)
MANAGED_BY = ("app.kubernetes.io/managed-by", SIDECAR_NAME)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_CONFIG_KEY_CHARS = re.compile(r"[-._a-zA-Z0-9]+")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
# A resource's (namespace, name).
Key = tuple[str | None, str]


@dataclass
class Transformed:
    """The manifests to write, and one line per resource saying what happened to it."""

    text: str
    report: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    """The subcommand: read, transform, write; messages on standard error."""
    try:
        sidecar, config_text = _sidecar(args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    try:
        outcome = uninject(text) if args.uninject else inject(text, sidecar, config_text)
    except (ManifestError, InjectError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT_ERROR
    sys.stdout.write(outcome.text)
    for line in outcome.report:
        print(line, file=sys.stderr)
    return 0


def _sidecar(args: argparse.Namespace) -> tuple[Sidecar, str | None]:
    """The options as a sidecar to add; ``ConfigError`` for options that cannot work."""
    for flag, port in (("--port", args.port), ("--admin-port", args.admin_port)):
        if not 1 <= port <= 65535:
            raise ConfigError(f"{flag}: {port} is not a port")
    if args.port == args.admin_port:
        raise ConfigError("--port and --admin-port must differ")
    config_text = None
    if args.config:
        config_text = _read_config(args.config, args.upstream)
    elif args.upstream:
        load_settings(upstream_url=args.upstream)
    llm_secret = None
    if args.llm_secret:
        name, _, key = args.llm_secret.partition("/")
        if not _DNS_SUBDOMAIN.fullmatch(name) or not _CONFIG_KEY_CHARS.fullmatch(key):
            raise ConfigError("--llm-secret: expected NAME/KEY, a Secret and one of its keys")
        llm_secret = (name, key)
    if args.config_map and not _DNS_SUBDOMAIN.fullmatch(args.config_map):
        raise ConfigError("--config-map: not a ConfigMap name")
    sidecar = Sidecar(
        image=args.image,
        native=args.native,
        port=args.port,
        admin_port=args.admin_port,
        upstream=args.upstream,
        config_map=args.config_map,
        llm_secret=llm_secret,
        agent_env=tuple(_agent_env(option) for option in args.agent_env),
        agent_containers=frozenset(args.agent_container),
    )
    return sidecar, config_text


def _agent_env(option: str) -> tuple[str, str]:
    """``NAME`` or ``NAME=/prefix``."""
    name, _, path = option.partition("=")
    if not _ENV_NAME.fullmatch(name) or (path and not path.startswith("/")):
        raise ConfigError(f"--agent-env: expected NAME or NAME=/path, got {option!r}")
    return name, path.rstrip("/")


def _read_config(path: str, upstream: str | None) -> str:
    """The config file's text, checked as the sidecar will check it at start."""
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    load_settings(config_file=path, upstream_url=upstream)
    return text


def inject(text: str, sidecar: Sidecar, config_text: str | None = None) -> Transformed:
    """``text`` with the sidecar in every pod template, and with ``config_text`` a ConfigMap
    after each workload to carry it."""
    stream = _Stream(text)
    outcome = Transformed("")
    generated = {_key(item): item for _, item in stream.generated()}
    claimed: set[Key] = set()
    released: set[Key] = set()
    for document in stream.documents:
        made: list[Any] = []
        for item in _resources(document.data):
            if _is_generated(item):
                continue
            config_map = _inject_resource(item, sidecar, config_text, outcome, released)
            if config_map is None:
                continue
            claimed.add(_key(config_map))
            existing = generated.get(_key(config_map))
            if existing is None:
                made.append(config_map)
                outcome.report.append(f'configmap "{_name(config_map)}" added')
            elif plain(existing["data"]) != plain(config_map["data"]):
                existing["data"] = config_map["data"]
        stream.add_after(document, made)
    stream.drop(released - claimed, outcome)
    outcome.text = stream.render()
    return outcome


def uninject(text: str) -> Transformed:
    """``text`` with everything ``inject`` added taken out again."""
    stream = _Stream(text)
    outcome = Transformed("")
    released: set[Key] = set()
    for document in stream.documents:
        for item in _resources(document.data):
            if not _is_generated(item):
                _uninject_resource(item, outcome, released)
    stream.drop(released, outcome)
    outcome.text = stream.render()
    return outcome


class _Stream:
    """The documents being changed: each is rewritten at the end only if its content changed."""

    def __init__(self, text: str) -> None:
        self.documents = split(text)
        self._before = [plain(document.data) for document in self.documents]
        self._style = stream_style(self.documents)
        self._after: dict[int, list[Document]] = {}

    def generated(self) -> Iterator[tuple[Document, Any]]:
        """The ConfigMaps an earlier run generated, with the document holding each."""
        for document in self.documents:
            for item in _resources(document.data):
                if _is_generated(item):
                    yield document, item

    def add_after(self, document: Document, resources: list[Any]) -> None:
        """New resources after ``document``: in its items when it is a List."""
        if not resources:
            return
        if document.data.get("kind") == "List":
            document.data["items"].extend(resources)
        else:
            made = [new_document(resource, self._style) for resource in resources]
            self._after.setdefault(id(document), []).extend(made)

    def drop(self, keys: set[Key], outcome: Transformed) -> None:
        """Take out the generated ConfigMaps named by ``keys``."""
        for document, item in list(self.generated()):
            if _key(item) not in keys:
                continue
            if item is document.data:
                document.data = None
                document.marker = document.text = ""
            else:
                document.data["items"].remove(item)
            outcome.report.append(f'configmap "{_name(item)}" removed')

    def render(self) -> str:
        result = []
        for document, before in zip(self.documents, self._before, strict=True):
            if document.data is not None and plain(document.data) != before:
                document.rewrite()
            if document.render():
                result.append(document)
            result.extend(self._after.get(id(document), []))
        return join(result)


def _inject_resource(
    resource: Any,
    sidecar: Sidecar,
    config_text: str | None,
    outcome: Transformed,
    released: set[Key],
) -> Any:
    """Inject one resource; the ConfigMap it needs, when inject makes one."""
    kind, name = resource.get("kind"), _name(resource)
    label = f'{str(kind).lower()} "{name}"'
    template = _pod_template(resource)
    if template is None:
        outcome.report.append(f"{label} skipped")
        return None
    config_map = None
    try:
        if has_foreign_sidecar(template):
            raise InjectError(
                f"already has a container named {SIDECAR_NAME} that inject did not add; "
                "remove it first"
            )
        wanted = sidecar
        if config_text is not None:
            config_map = _config_map(resource, config_text)
            wanted = replace(
                sidecar,
                config_map=config_map["metadata"]["name"],
                config_checksum=hashlib.sha256(config_text.encode()).hexdigest()[:16],
                config_generated=True,
            )
        before = plain(template)
        previous = read_status(template)
        places = remove(template)
        status, warnings = add(template, wanted, places)
    except Skip as reason:
        outcome.report.append(f"{label} skipped: {reason}")
        return None
    except InjectError as exc:
        raise InjectError(f"{label}: {exc}") from None
    if previous and previous.config_map and previous.config_map != status.config_map:
        released.add((_namespace(resource), previous.config_map))
    if plain(template) == before:
        outcome.report.append(f"{label} unchanged (already injected)")
    else:
        outcome.report.append(f"{label} {'updated' if previous else 'injected'}")
    outcome.report.extend(f"{label}: {warning}" for warning in warnings)
    return config_map


def _uninject_resource(resource: Any, outcome: Transformed, released: set[Key]) -> None:
    label = f'{str(resource.get("kind")).lower()} "{_name(resource)}"'
    template = _pod_template(resource)
    try:
        status = read_status(template) if template is not None else None
    except InjectError as exc:
        raise InjectError(f"{label}: {exc}") from None
    if status is None:
        outcome.report.append(f"{label} skipped")
        return
    remove(template)
    if status.config_map:
        released.add((_namespace(resource), status.config_map))
    outcome.report.append(f"{label} uninjected")


def _resources(data: Any) -> Iterator[Any]:
    """The Kubernetes objects in one document: itself, or a List's items."""
    if not isinstance(data, dict) or "kind" not in data:
        return
    if data["kind"] == "List":
        yield from (item for item in data.get("items") or [] if isinstance(item, dict))
    else:
        yield data


def _pod_template(resource: Any) -> Any:
    """The pod template of a workload (a Pod is its own), or None."""
    kind = resource.get("kind")
    if kind not in WORKLOAD_KINDS:
        return None
    spec = resource.get("spec")
    if kind == "Pod":
        template = resource
    elif kind == "CronJob":
        template = (((spec or {}).get("jobTemplate") or {}).get("spec") or {}).get("template")
    else:
        template = (spec or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        return template
    return None


def _config_map(workload: Any, config_text: str) -> CommentedMap:
    """The ConfigMap that carries the sidecar's config file for one workload."""
    name = _name(workload)
    if not name:
        raise InjectError("has no metadata.name to name its ConfigMap after")
    metadata = CommentedMap(name=f"{name}-{SIDECAR_NAME}"[:253])
    namespace = _namespace(workload)
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = CommentedMap([MANAGED_BY])
    text = config_text if config_text.endswith("\n") else config_text + "\n"
    return CommentedMap(
        apiVersion="v1",
        kind="ConfigMap",
        metadata=metadata,
        data=CommentedMap({CONFIG_KEY: LiteralScalarString(text)}),
    )


def _is_generated(data: Any) -> bool:
    if not isinstance(data, dict) or data.get("kind") != "ConfigMap":
        return False
    labels = (data.get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY[0]) == MANAGED_BY[1]


def _key(resource: Any) -> Key:
    return _namespace(resource), _name(resource)


def _name(resource: Any) -> str:
    return str((resource.get("metadata") or {}).get("name") or "")


def _namespace(resource: Any) -> str | None:
    namespace = (resource.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None
