"""Adding the sidecar to one pod template, and taking exactly that out again.

Everything added is listed in the pod template's ``tool-retry-sidecar/status`` annotation
(as Istio's ``sidecar.istio.io/status`` lists what it injected): the annotations and labels
set, the volume, the generated ConfigMap, and each agent variable with the entry it
replaced. Taking the sidecar out reads that record, so it removes only what was added and
gives replaced variables back their original entries.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from yarl import URL

from sidecar import __version__
from sidecar.inject.args import CONFIG_KEY
from sidecar.inject.yamltext import dump, load

SIDECAR_NAME = "tool-retry-sidecar"
STATUS_ANNOTATION = "tool-retry-sidecar/status"
INJECTED_LABEL = "tool-retry-sidecar/injected"
CHECKSUM_ANNOTATION = "tool-retry-sidecar/config-checksum"
PROXY_PORT_NAME = "sidecar-proxy"
ADMIN_PORT_NAME = "sidecar-admin"
CONFIG_DIR = "/etc/tool-retry-sidecar"
VOLUME_NAME = "tool-retry-sidecar-config"
RUN_AS = 10001
DEFAULT_GRACE_SECONDS = 30
DRAIN_SECONDS = 20
# Left of the pod's grace period for the kubelet to stop the sidecar after its drain.
GRACE_MARGIN_SECONDS = 5
# Plain-container mode: the agent beside the sidecar gets this long to finish its calls.
PRESTOP_SLEEP_SECONDS = 5


class InjectError(Exception):
    """A workload that cannot be changed as asked, stated in one line."""


class Skip(Exception):
    """A workload left as it is, with the reason shown to the user."""


@dataclass(frozen=True)
class Sidecar:
    """What to add to a pod template."""

    image: str
    native: bool = True
    port: int = 8090
    admin_port: int = 9464
    upstream: str | None = None
    config_map: str | None = None
    config_checksum: str | None = None
    config_generated: bool = False
    llm_secret: tuple[str, str] | None = None
    # (variable, path): each variable becomes the sidecar's URL plus its route's path.
    agent_env: tuple[tuple[str, str], ...] = ()
    agent_containers: frozenset[str] = frozenset()

    def agent_url(self, path: str = "") -> str:
        return f"http://localhost:{self.port}{path}"


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

    container = _container(sidecar, upstream, _drain_seconds(spec, sidecar), status.volume)
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


def _container(
    sidecar: Sidecar, upstream: str | None, drain_seconds: int, volume: str | None
) -> CommentedMap:
    # Both addresses explicit, whatever the image's defaults: only the pod's own containers
    # reach the proxy; the kubelet's probes and Prometheus reach the admin port on the pod IP.
    env: list[dict[str, Any]] = [
        {"name": "SIDECAR_HOST", "value": "127.0.0.1"},
        {"name": "SIDECAR_PORT", "value": str(sidecar.port)},
        {"name": "SIDECAR_ADMIN_HOST", "value": "0.0.0.0"},
        {"name": "SIDECAR_ADMIN_PORT", "value": str(sidecar.admin_port)},
        {"name": "SIDECAR_DRAIN_TIMEOUT_MS", "value": str(drain_seconds * 1000)},
    ]
    if upstream:
        env.append({"name": "SIDECAR_UPSTREAM_URL", "value": upstream})
    if volume:
        env.append({"name": "SIDECAR_CONFIG_FILE", "value": f"{CONFIG_DIR}/{CONFIG_KEY}"})
    if sidecar.llm_secret:
        name, key = sidecar.llm_secret
        env.append(
            {
                "name": "SIDECAR_LLM_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": name, "key": key}},
            }
        )
    container: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": sidecar.image,
        "imagePullPolicy": "IfNotPresent",
    }
    if sidecar.native:
        container["restartPolicy"] = "Always"
    container["ports"] = [
        {"name": PROXY_PORT_NAME, "containerPort": sidecar.port, "protocol": "TCP"},
        {"name": ADMIN_PORT_NAME, "containerPort": sidecar.admin_port, "protocol": "TCP"},
    ]
    container["env"] = env
    container["startupProbe"] = _probe("/readyz", periodSeconds=1, failureThreshold=30)
    container["readinessProbe"] = _probe("/readyz", periodSeconds=5)
    container["livenessProbe"] = _probe("/healthz", periodSeconds=10, failureThreshold=3)
    if not sidecar.native:
        sleep = ["sleep", str(PRESTOP_SLEEP_SECONDS)]
        container["lifecycle"] = {"preStop": {"exec": {"command": sleep}}}
    container["resources"] = {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    }
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if volume:
        container["volumeMounts"] = [{"name": volume, "mountPath": CONFIG_DIR, "readOnly": True}]
    commented: CommentedMap = _commented(container)
    return commented


def _probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": ADMIN_PORT_NAME}, **timing}


def _drain_seconds(spec: Any, sidecar: Sidecar) -> int:
    """The drain, fitted inside the pod's grace period with room for the kubelet."""
    grace: int = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spare = grace - GRACE_MARGIN_SECONDS - (0 if sidecar.native else PRESTOP_SLEEP_SECONDS)
    return max(1, min(DRAIN_SECONDS, spare))


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


def _commented(value: Any) -> Any:
    """Plain data as round-trip nodes, so it is written in block style like its neighbours."""
    if isinstance(value, dict):
        return CommentedMap((key, _commented(item)) for key, item in value.items())
    if isinstance(value, list):
        return CommentedSeq(_commented(item) for item in value)
    return value
