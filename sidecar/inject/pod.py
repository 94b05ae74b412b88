"""Adding the sidecar to one pod template, and taking exactly that out again.

Everything added is listed in the pod template's ``tool-retry-sidecar/status`` annotation
(as Istio's ``sidecar.istio.io/status`` lists what it injected): the annotations and labels
set, the volume, the generated ConfigMap, and each agent variable with the entry it
replaced. Taking the sidecar out reads that record, so it removes only what was added and
gives replaced variables back their original entries. The sidecar's container itself
is ``container``'s.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from yarl import URL

from sidecar import __version__
from sidecar.inject.container import ADMIN_PORT_NAME, SIDECAR_NAME, Sidecar, container_spec
from sidecar.inject.yamltext import dump, load

STATUS_ANNOTATION = "tool-retry-sidecar/status"
INJECTED_LABEL = "tool-retry-sidecar/injected"
CHECKSUM_ANNOTATION = "tool-retry-sidecar/config-checksum"
VOLUME_NAME = "tool-retry-sidecar-config"


class InjectError(Exception):
    """A workload that cannot be changed as asked, stated in one line."""


class Skip(Exception):
    """A workload left as it is, with the reason shown to the user."""


@dataclass
class Status:
    """The record of what was added, kept as JSON in the pod template's annotation."""

    version: str = __version__
    annotations: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    volume: str | None = None
    config_map: str | None = None
    # container -> variable -> the entry's other keys as YAML (its style kept), or None
    # when inject added the variable.
    agent_env: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass
class Places:
    """Where the removed items stood, so adding them again puts them back there."""

    container: tuple[str, int] | None = None
    volume: int | None = None
    env: dict[tuple[str, str], int] = field(default_factory=dict)


def read_status(template: Any) -> Status | None:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if STATUS_ANNOTATION not in annotations:
        return None
    try:
        record = json.loads(str(annotations[STATUS_ANNOTATION]))
        return Status(**record)
    except (ValueError, TypeError):
        raise InjectError(f"the {STATUS_ANNOTATION} annotation is not one inject wrote") from None


def has_foreign_sidecar(template: Any) -> bool:
    """A container of the sidecar's name that inject did not add (copied in by hand)."""
    spec = template.get("spec") or {}
    names = {c.get("name") for key in ("initContainers", "containers") for c in spec.get(key) or []}
    return SIDECAR_NAME in names and read_status(template) is None


def add(template: Any, sidecar: Sidecar, places: Places | None = None) -> tuple[Status, list[str]]:
    """Add the sidecar to ``template``; the record of what was added, and any warnings."""
    places = places or Places()
    spec = template["spec"]
    _refuse_unfit(spec, sidecar)
    status = Status(config_map=sidecar.config_map if sidecar.config_generated else None)
    warnings: list[str] = []
    agents = _agent_containers(spec, sidecar)
    upstream = sidecar.upstream or _upstream_from_agents(agents, sidecar)

    if sidecar.config_map:
        status.volume = _unused_volume_name(spec)
        volume = CommentedMap(name=status.volume, configMap=CommentedMap(name=sidecar.config_map))
        _insert(_child_list(spec, "volumes"), places.volume, volume)

    container = container_spec(sidecar, spec, upstream, status.volume)
    target = "initContainers" if sidecar.native else "containers"
    index = places.container[1] if places.container and places.container[0] == target else None
    _insert(_child_list(spec, target, before="containers"), index, container)

    metadata = _child_map(template, "metadata", at=0)
    labels = _child_map(metadata, "labels")
    labels[INJECTED_LABEL] = "true"
    status.labels.append(INJECTED_LABEL)
    annotations = _child_map(metadata, "annotations", after="labels")
    if any(str(key).startswith("prometheus.io/") for key in annotations):
        warnings.append(
            "its prometheus.io/* annotations are kept; scrape the sidecar's admin port "
            f"{sidecar.admin_port} ({ADMIN_PORT_NAME}) with a PodMonitor instead"
        )
    else:
        for key, value in _scrape_annotations(sidecar).items():
            annotations[key] = value
            status.annotations.append(key)
    if sidecar.config_checksum:
        annotations[CHECKSUM_ANNOTATION] = sidecar.config_checksum
        status.annotations.append(CHECKSUM_ANNOTATION)

    for agent in agents:
        status.agent_env[agent["name"]] = {
            name: _point_agent(agent, name, sidecar.agent_url(path), places)
            for name, path in sidecar.agent_env
        }

    annotations[STATUS_ANNOTATION] = status.to_json()
    return status, warnings


def remove(template: Any) -> Places | None:
    """Take out what ``add`` added; where it stood, or None when nothing was added."""
    status = read_status(template)
    if status is None:
        return None
    places = Places()
    spec = template["spec"]
    for key in ("initContainers", "containers"):
        containers = spec.get(key) or []
        for index, container in enumerate(containers):
            if container.get("name") == SIDECAR_NAME:
                del containers[index]
                places.container = (key, index)
                break
    if status.volume:
        volumes = spec.get("volumes") or []
        for index, volume in enumerate(volumes):
            if volume.get("name") == status.volume:
                del volumes[index]
                places.volume = index
                break
    for container in spec.get("containers") or []:
        for name, original in status.agent_env.get(container.get("name"), {}).items():
            _restore_agent(container, name, original, places)
        _drop_if_empty(container, "env")
    metadata = template["metadata"]
    for key in status.labels:
        metadata.get("labels", {}).pop(key, None)
    for key in [*status.annotations, STATUS_ANNOTATION]:
        metadata.get("annotations", {}).pop(key, None)
    for parent, key in ((spec, "initContainers"), (spec, "volumes")):
        _drop_if_empty(parent, key)
    for key in ("labels", "annotations"):
        _drop_if_empty(metadata, key)
    _drop_if_empty(template, "metadata")
    return places


def _refuse_unfit(spec: Any, sidecar: Sidecar) -> None:
    if spec.get("hostNetwork"):
        raise Skip("hostNetwork: true (the sidecar's ports would be the node's)")
    if not sidecar.native and spec.get("restartPolicy") in ("Never", "OnFailure"):
        raise Skip(
            f"restartPolicy: {spec['restartPolicy']} with --no-native: a plain sidecar "
            "container never exits, so the pod would never complete"
        )
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            for port in container.get("ports") or []:
                if port.get("containerPort") in (sidecar.port, sidecar.admin_port):
                    raise InjectError(
                        f"container {container.get('name')!r} already uses port "
                        f"{port['containerPort']}; choose others with --port / --admin-port"
                    )


def _agent_containers(spec: Any, sidecar: Sidecar) -> list[Any]:
    if not sidecar.agent_env:
        return []
    containers = [c for c in spec.get("containers") or [] if c.get("name") != SIDECAR_NAME]
    if not sidecar.agent_containers:
        return containers
    chosen = [c for c in containers if c.get("name") in sidecar.agent_containers]
    if not chosen:
        wanted = ", ".join(sorted(sidecar.agent_containers))
        raise InjectError(f"no container named {wanted}")
    return chosen


def _upstream_from_agents(agents: list[Any], sidecar: Sidecar) -> str | None:
    """The tool the agents called before: the one URL their (path-less) variable held."""
    if sidecar.config_map:
        return None
    names = {name for name, path in sidecar.agent_env if not path}
    urls = set()
    for agent in agents:
        for entry in agent.get("env") or []:
            if entry.get("name") in names and isinstance(entry.get("value"), str):
                urls.add(str(entry["value"]))
    urls.discard(sidecar.agent_url())
    if len(urls) == 1:
        url = URL(urls.pop())
        if url.scheme in ("http", "https") and url.host:
            return str(url)
    held = f" ({', '.join(sorted(names))} holds no single http(s) URL)" if agents and names else ""
    raise InjectError(
        f"no upstream for the sidecar: give --upstream URL or --config FILE with routes{held}"
    )


def _scrape_annotations(sidecar: Sidecar) -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(sidecar.admin_port),
        "prometheus.io/path": "/metrics",
    }


def _unused_volume_name(spec: Any) -> str:
    taken = {volume.get("name") for volume in spec.get("volumes") or []}
    name, suffix = VOLUME_NAME, 1
    while name in taken:
        suffix += 1
        name = f"{VOLUME_NAME}-{suffix}"
    return name


def _point_agent(agent: Any, name: str, url: str, places: Places) -> str | None:
    """Set the agent's variable to the sidecar; the entry it had before, if any."""
    env = _child_list(agent, "env")
    for entry in env:
        if entry.get("name") == name:
            original = dump(CommentedMap((k, v) for k, v in entry.items() if k != "name"))
            for key in [k for k in entry if k not in ("name", "value")]:
                del entry[key]
            entry["value"] = url
            return original
    _insert(env, places.env.get((agent["name"], name)), CommentedMap(name=name, value=url))
    return None


def _restore_agent(container: Any, name: str, original: str | None, places: Places) -> None:
    env = container.get("env") or []
    for index, entry in enumerate(env):
        if entry.get("name") != name:
            continue
        if original is None:
            del env[index]
            places.env[(container["name"], name)] = index
            return
        before = load(original)
        for key in [k for k in entry if k != "name" and k not in before]:
            del entry[key]
        for key, value in before.items():
            entry[key] = value
        return


def _child_map(parent: Any, key: str, *, at: int | None = None, after: str | None = None) -> Any:
    if parent.get(key) is None:
        position = at if at is not None else _position(parent, after)
        parent.insert(position, key, CommentedMap())
    return parent[key]


def _child_list(parent: Any, key: str, *, before: str | None = None) -> Any:
    if parent.get(key) is None:
        keys = list(parent)
        position = keys.index(before) if before in keys and before != key else len(keys)
        parent.insert(position, key, CommentedSeq())
    return parent[key]


def _position(parent: Any, after: str | None) -> int:
    keys = list(parent)
    return keys.index(after) + 1 if after in keys else len(keys)


def _insert(items: Any, index: int | None, item: Any) -> None:
    if index is None or index > len(items):
        items.append(item)
    else:
        items.insert(index, item)


def _drop_if_empty(parent: Any, key: str) -> None:
    if key in parent and not parent[key]:
        del parent[key]
