"""``inject``: real-looking manifests in, valid injected manifests out, and back again."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from sidecar.cli import main

MANIFESTS = Path(__file__).resolve().parent / "manifests"
ROOT = MANIFESTS.parent.parent
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}

CASES = yaml.safe_load((MANIFESTS / "cases.yaml").read_text())


def run(capsys: pytest.CaptureFixture[str], *args: str, stdin: str = "") -> tuple[int, str, str]:
    """The command line in-process: exit code, standard output, standard error."""
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(["inject", *args])
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, out, err


def options(case: str) -> list[str]:
    routes = str(MANIFESTS / "routes.yaml")
    return [routes if arg == "ROUTES" else arg for arg in CASES[case]]


def inject_case(capsys: pytest.CaptureFixture[str], case: str, *extra: str) -> tuple[int, str, str]:
    """``inject`` over one of the manifests with its usual options (and ``extra``)."""
    return run(capsys, str(MANIFESTS / f"{case}.yaml"), *options(case), *extra)


def objects(text: str) -> list[dict[str, Any]]:
    """Every Kubernetes object in a stream, the items of a List included."""
    found = []
    for document in yaml.safe_load_all(text):
        if document and document.get("kind") == "List":
            found.extend(document["items"])
        elif document:
            found.append(document)
    return found


def pod_spec(resource: dict[str, Any]) -> dict[str, Any] | None:
    kind, spec = resource["kind"], resource.get("spec", {})
    if kind not in WORKLOADS:
        return None
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec["template"]["spec"]


def pod_metadata(resource: dict[str, Any]) -> dict[str, Any]:
    kind, spec = resource["kind"], resource["spec"]
    if kind == "Pod":
        return resource["metadata"]
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["metadata"]
    return spec["template"]["metadata"]


def sidecar_of(spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    found = [
        (key, container)
        for key in ("initContainers", "containers")
        for container in spec.get(key, [])
        if container["name"] == "tool-retry-sidecar"
    ]
    assert len(found) == 1
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def api_server_problems(spec: dict[str, Any]) -> list[str]:
    """What the API server refuses beyond the schema kubernetes-validate checks."""
    problems = []
    containers = spec.get("initContainers", []) + spec["containers"]
    names = Counter(c["name"] for c in containers)
    problems += [f"container {n} twice" for n, count in names.items() if count > 1]
    volumes = Counter(v["name"] for v in spec.get("volumes", []))
    problems += [f"volume {n} twice" for n, count in volumes.items() if count > 1]
    for container in containers:
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                problems.append(f"{container['name']} mounts missing volume {mount['name']}")
        env = Counter(e["name"] for e in container.get("env", []))
        problems += [f"{container['name']} sets {n} twice" for n, c in env.items() if c > 1]
        for port in container.get("ports", []):
            if len(port.get("name", "")) > 15:
                problems.append(f"port name {port['name']} longer than 15")
    for container in spec.get("initContainers", []):
        if container.get("restartPolicy") not in (None, "Always"):
            problems.append(f"init container {container['name']} restartPolicy")
    return problems


@pytest.mark.parametrize("case", sorted(CASES))
def test_injected_manifests_are_valid_and_round_trip_byte_for_byte(case, capsys, tmp_path):
    original = (MANIFESTS / f"{case}.yaml").read_text()

    code, injected, report = inject_case(capsys, case)
    assert code == 0, report

    workloads = 0
    for resource in objects(injected):
        for version in VERSIONS:
            kubernetes_validate.validate(resource, version, strict=True)
        spec = pod_spec(resource)
        if spec is not None and "skipped" not in report:
            workloads += 1
            sidecar_of(spec)
            assert api_server_problems(spec) == []
    assert workloads or "skipped" in report

    (tmp_path / "injected.yaml").write_text(injected)
    code, again, _ = run(capsys, str(tmp_path / "injected.yaml"), *options(case))
    assert code == 0 and again == injected

    code, uninjected, _ = run(capsys, "--uninject", str(tmp_path / "injected.yaml"))
    assert code == 0 and uninjected == original


def test_native_sidecar_is_locked_down_and_listens_on_loopback_with_admin_reachable(capsys):
    code, out, _ = inject_case(capsys, "agent-and-service")
    assert code == 0
    deployment = objects(out)[0]
    where, sidecar = sidecar_of(pod_spec(deployment))

    assert where == "initContainers" and sidecar["restartPolicy"] == "Always"
    env = env_of(sidecar)
    assert env["SIDECAR_HOST"] == "127.0.0.1" and env["SIDECAR_ADMIN_HOST"] == "0.0.0.0"
    assert env["SIDECAR_UPSTREAM_URL"] == "http://weather-tool.tools.svc:8080"
    assert env["SIDECAR_LLM_API_KEY"] == {"secretKeyRef": {"name": "openai", "key": "api-key"}}
    admin = {p["name"]: p["containerPort"] for p in sidecar["ports"]}["sidecar-admin"]
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/healthz")):  # fmt: skip
        assert sidecar[probe]["httpGet"] == {"path": path, "port": "sidecar-admin"}
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert sidecar["resources"]["limits"]["memory"]
    annotations = pod_metadata(deployment)["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin)
    assert annotations["prometheus.io/path"] == "/metrics"
    agent = pod_spec(deployment)["containers"][0]
    assert env_of(agent)["TOOL_BASE_URL"] == "http://localhost:8090"
    assert env_of(agent)["LOG_LEVEL"] == "info"


def test_other_documents_and_comments_pass_through_unchanged(capsys):
    original = (MANIFESTS / "agent-and-service.yaml").read_text()
    code, out, report = inject_case(capsys, "agent-and-service")

    assert code == 0
    service = original[original.index("---\n# Traffic") :]
    assert out.endswith(service)
    assert out.startswith("# A research agent and the Service")
    assert "# The weather tool; the sidecar takes this over and fronts it." in out
    assert report.splitlines() == [
        'deployment "research-agent" injected',
        'service "research-agent" skipped',
    ]


def test_plain_container_mode_puts_the_sidecar_beside_the_agent_with_a_pre_stop_pause(capsys):
    code, out, _ = inject_case(capsys, "kubectl-list")
    assert code == 0
    daemonset = objects(out)[0]
    where, sidecar = sidecar_of(pod_spec(daemonset))

    assert where == "containers" and "restartPolicy" not in sidecar
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    # Plain mode: the pause and the drain both fit in the default 30 s grace period.
    assert env_of(sidecar)["SIDECAR_DRAIN_TIMEOUT_MS"] == "20000"
    assert "initContainers" not in pod_spec(daemonset)


def test_config_becomes_a_configmap_per_workload_mounted_under_a_free_volume_name(capsys, tmp_path):
    code, out, report = inject_case(capsys, "crowded-pod")
    assert code == 0
    statefulset, config_map = objects(out)
    spec = pod_spec(statefulset)
    _, sidecar = sidecar_of(spec)

    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tool-retry-sidecar-config"]["configMap"]["name"] == "planner-settings"
    ours = volumes["tool-retry-sidecar-config-2"]["configMap"]["name"]
    assert ours == config_map["metadata"]["name"] == "planner-tool-retry-sidecar"
    mount = sidecar["volumeMounts"][0]
    assert mount["name"] == "tool-retry-sidecar-config-2" and mount["readOnly"] is True
    config_file = env_of(sidecar)["SIDECAR_CONFIG_FILE"]
    assert Path(config_file).parent == Path(mount["mountPath"])
    assert config_map["data"][Path(config_file).name] == (MANIFESTS / "routes.yaml").read_text()
    assert 'configmap "planner-tool-retry-sidecar" added' in report

    # The file the pod mounts is a configuration the sidecar accepts.
    (tmp_path / "sidecar.yaml").write_text(config_map["data"]["sidecar.yaml"])
    checked = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "--config", tmp_path / "sidecar.yaml"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert [r["name"] for r in json.loads(checked.stdout)["routes"]] == ["weather", "search"]


def test_existing_containers_annotations_and_grace_period_are_respected(capsys):
    code, out, report = inject_case(capsys, "crowded-pod")
    assert code == 0
    statefulset = objects(out)[0]
    spec = pod_spec(statefulset)
    _, sidecar = sidecar_of(spec)

    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-db", "tool-retry-sidecar"]
    assert [c["name"] for c in spec["containers"]] == ["planner", "executor", "redis"]
    agents = {c["name"]: env_of(c) for c in spec["containers"]}
    assert agents["planner"]["TOOLS_URL"] == "http://localhost:8090"
    assert "TOOLS_URL" not in agents["executor"]
    # The pod scrapes its own metrics already; those annotations stay the user's.
    annotations = pod_metadata(statefulset)["annotations"]
    assert annotations["prometheus.io/port"] == "8000"
    assert "prometheus.io/* annotations are kept" in report
    # terminationGracePeriodSeconds is 15: the drain ends 5 s before the kubelet kills.
    assert env_of(sidecar)["SIDECAR_DRAIN_TIMEOUT_MS"] == "10000"


def test_every_app_container_is_an_agent_unless_one_is_named(capsys, tmp_path):
    manifest = (MANIFESTS / "crowded-pod.yaml").read_text()
    (tmp_path / "crowded.yaml").write_text(manifest)
    code, out, _ = run(
        capsys, str(tmp_path / "crowded.yaml"), "--agent-env", "TOOLS_URL",
        "--upstream", "http://tools:8080",
    )  # fmt: skip
    assert code == 0
    spec = pod_spec(objects(out)[0])

    assert {env_of(c)["TOOLS_URL"] for c in spec["containers"]} == {"http://localhost:8090"}
    assert env_of(sidecar_of(spec)[1])["SIDECAR_UPSTREAM_URL"] == "http://tools:8080"


def test_cronjob_and_job_get_a_native_sidecar_and_are_skipped_in_plain_mode(capsys):
    path = str(MANIFESTS / "batch.yaml")
    code, out, report = run(capsys, path, "--agent-env", "TOOL_BASE_URL")
    assert code == 0
    cronjob, job = objects(out)
    assert sidecar_of(pod_spec(cronjob))[0] == "initContainers"
    assert env_of(sidecar_of(pod_spec(job))[1])["SIDECAR_UPSTREAM_URL"] == "http://search-tool:9000"

    code, out, report = run(capsys, path, "--agent-env", "TOOL_BASE_URL", "--no-native")
    assert code == 0
    assert out == (MANIFESTS / "batch.yaml").read_text()
    assert 'cronjob "nightly-report" skipped: restartPolicy: OnFailure with --no-native' in report
    assert 'job "backfill" skipped: restartPolicy: Never with --no-native' in report


def test_a_changed_option_updates_the_sidecar_in_place(capsys, tmp_path):
    path = tmp_path / "crowded.yaml"
    code, injected, _ = inject_case(capsys, "crowded-pod")
    path.write_text(injected)

    code, updated, report = run(capsys, str(path), *options("crowded-pod"), "--image", "trs:2")
    assert code == 0
    assert 'statefulset "planner" updated' in report
    before, after = pod_spec(objects(injected)[0]), pod_spec(objects(updated)[0])
    assert sidecar_of(after)[1]["image"] == "trs:2"
    sidecar_of(after)[1]["image"] = sidecar_of(before)[1]["image"]
    assert after == before

    # Without --config the generated ConfigMap and its volume go away again.
    code, plain_upstream, report = run(
        capsys, str(path), "--agent-env", "TOOLS_URL", "--agent-container", "planner",
        "--upstream", "http://tools:8080",
    )  # fmt: skip
    assert code == 0
    assert [o["kind"] for o in objects(plain_upstream)] == ["StatefulSet"]
    assert 'configmap "planner-tool-retry-sidecar" removed' in report
    volumes = [v["name"] for v in pod_spec(objects(plain_upstream)[0])["volumes"]]
    assert volumes == ["tool-retry-sidecar-config", "scratch"]


def test_uninject_takes_out_the_generated_configmaps_of_a_list(capsys, tmp_path):
    code, injected, _ = inject_case(capsys, "kubectl-list")
    kinds = [o["kind"] for o in objects(injected)]
    assert kinds == ["DaemonSet", "ReplicaSet", "Service", "ConfigMap", "ConfigMap"]
    (tmp_path / "injected.yaml").write_text(injected)

    code, out, report = run(capsys, "--uninject", str(tmp_path / "injected.yaml"))
    assert code == 0
    assert [o["kind"] for o in objects(out)] == ["DaemonSet", "ReplicaSet", "Service"]
    assert report.count("removed") == 2 and report.count("uninjected") == 2


def test_stdin_to_stdout_with_the_summary_on_stderr():
    manifest = (MANIFESTS / "bare-pod.yaml").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "inject", "-", "--agent-env", "OPENAI_TOOLS_BASE"],
        input=manifest, capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip

    assert result.returncode == 0
    assert result.stderr == 'pod "scratch-agent" injected\n'
    pod = objects(result.stdout)[0]
    assert env_of(sidecar_of(pod["spec"])[1])["SIDECAR_UPSTREAM_URL"] == "http://calculator:8080/v1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llm-secret", "sk-live-1234"], "--llm-secret: expected NAME/KEY"),
        (["--agent-env", "NOT_SET_ANYWHERE"], "no upstream for the sidecar"),
        (["--upstream", "http://t:1", "--port", "9464"], "--port and --admin-port must differ"),
        (["--upstream", "http://t:1", "--admin-port", "8000"], "already uses port 8000"),
        (["--upstream", "http://t:1", "--agent-env", "X", "--agent-container", "nope"],
         "no container named nope"),
    ],
)  # fmt: skip
def test_options_that_cannot_work_fail_with_one_line(capsys, args, message):
    code, out, err = run(capsys, str(MANIFESTS / "crowded-pod.yaml"), *args)

    assert code in (1, 2) and out == ""
    assert len(err.splitlines()) == 1 and message in err
    assert "sk-live-1234" not in err


def test_a_hand_copied_sidecar_and_broken_yaml_are_refused(capsys):
    code, out, err = run(capsys, str(ROOT / "deploy/kubernetes.yaml"), "--upstream", "http://t:1")
    assert code == 1 and out == ""
    assert "already has a container named tool-retry-sidecar that inject did not add" in err

    code, out, err = run(capsys, "-", "--upstream", "http://t:1", stdin="a: [1\n---\nb: 2\n")
    assert code == 1 and out == ""
    assert err == "document 1 is not valid YAML, line 2\n"


async def test_the_injected_environment_keeps_the_proxy_on_loopback_and_admin_reachable(
    capsys, aiohttp_server
):
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"success": True, "path": request.path})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    tool = await aiohttp_server(app)
    manifest = (MANIFESTS / "bare-pod.yaml").read_text()
    manifest = manifest.replace("http://calculator:8080/v1", str(tool.make_url("/v1")))
    code, out, _ = run(capsys, "-", "--agent-env", "OPENAI_TOOLS_BASE", stdin=manifest)
    assert code == 0
    pod_env = env_of(sidecar_of(objects(out)[0]["spec"])[1])

    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "serve", "--port", "0", "--admin-port", "0",
        env={**env, **pod_env}, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        started = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=20))
        proxy, admin = started["proxy_port"], started["admin_port"]
        async with aiohttp.ClientSession() as client:
            async with client.post(f"http://127.0.0.1:{proxy}/chat", json={}) as response:
                assert response.status == 200
                assert (await response.json())["path"] == "/v1/chat"
            # 127.0.0.2 is this host too, but not the address the proxy is bound to.
            for path in ("/healthz", "/readyz", "/metrics"):
                async with client.get(f"http://127.0.0.2:{admin}{path}") as response:
                    assert response.status == 200
            with pytest.raises(aiohttp.ClientConnectionError):
                await client.get(f"http://127.0.0.2:{proxy}/chat")
    finally:
        process.kill()
        await process.wait()


def test_each_tool_variable_points_at_its_route_and_comes_back_on_uninject(capsys, tmp_path):
    manifest = tmp_path / "two-tools.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: two-tools\nspec:\n"
        "  selector:\n    matchLabels: {app: a}\n  template:\n    metadata:\n"
        "      labels: {app: a}\n    spec:\n      containers:\n      - name: agent\n"
        "        image: agent:1\n        env:\n        - name: WEATHER_URL\n"
        '          value: "http://weather-tool.tools.svc:8080"\n'
    )
    routes = str(MANIFESTS / "routes.yaml")
    agent_env = ["--agent-env", "WEATHER_URL=/weather", "--agent-env", "SEARCH_URL=/search/"]
    code, out, _ = run(capsys, str(manifest), "--config", routes, *agent_env)
    assert code == 0
    deployment, _ = objects(out)
    env = env_of(pod_spec(deployment)["containers"][0])

    assert env["WEATHER_URL"] == "http://localhost:8090/weather"
    assert env["SEARCH_URL"] == "http://localhost:8090/search"
    assert "SIDECAR_UPSTREAM_URL" not in env_of(sidecar_of(pod_spec(deployment))[1])

    (tmp_path / "injected.yaml").write_text(out)
    code, back, _ = run(capsys, "--uninject", str(tmp_path / "injected.yaml"))
    assert back == manifest.read_text()

    code, _, err = run(capsys, str(manifest), "--agent-env", "WEATHER_URL=weather")
    assert code == 2 and "--agent-env: expected NAME or NAME=/path" in err
