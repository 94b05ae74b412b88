"""The sidecar's container: what is asked for, and the container spec it becomes.

The spec sets both listen addresses, the ports, the probes, a drain that fits inside the
pod's grace period, the resources and a locked-down security context. Where the container
goes in the pod, and everything else inject changes there, is ``pod``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from sidecar.inject.args import CONFIG_KEY

SIDECAR_NAME = "tool-retry-sidecar"
PROXY_PORT_NAME = "sidecar-proxy"
ADMIN_PORT_NAME = "sidecar-admin"
CONFIG_DIR = "/etc/tool-retry-sidecar"
RUN_AS = 10001
DEFAULT_GRACE_SECONDS = 30
DRAIN_SECONDS = 20
# Left of the pod's grace period for the kubelet to stop the sidecar after its drain.
GRACE_MARGIN_SECONDS = 5
# Plain-container mode: the agent beside the sidecar gets this long to finish its calls.
PRESTOP_SLEEP_SECONDS = 5


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


def container_spec(
    sidecar: Sidecar, pod_spec: Any, upstream: str | None, volume: str | None
) -> CommentedMap:
    """The sidecar's container for the pod ``pod_spec``, mounting ``volume`` when given."""
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
    container["env"] = _env(sidecar, upstream, _drain_seconds(pod_spec, sidecar), volume)
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


def _env(
    sidecar: Sidecar, upstream: str | None, drain_seconds: int, volume: str | None
) -> list[dict[str, Any]]:
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
    return env


def _probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": ADMIN_PORT_NAME}, **timing}


def _drain_seconds(spec: Any, sidecar: Sidecar) -> int:
    """The drain, fitted inside the pod's grace period with room for the kubelet."""
    grace: int = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spare = grace - GRACE_MARGIN_SECONDS - (0 if sidecar.native else PRESTOP_SLEEP_SECONDS)
    return max(1, min(DRAIN_SECONDS, spare))


def _commented(value: Any) -> Any:
    """Plain data as round-trip nodes, so it is written in block style like its neighbours."""
    if isinstance(value, dict):
        return CommentedMap((key, _commented(item)) for key, item in value.items())
    if isinstance(value, list):
        return CommentedSeq(_commented(item) for item in value)
    return value
