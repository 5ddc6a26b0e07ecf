"""The Kubernetes manifests: every overlay renders with kustomize, validates against the
Kubernetes schema (offline), and follows the deployment's policies."""

from __future__ import annotations

import configparser
import importlib.util
import json
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ner_service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ["dev", "prod"]
APP_IMAGE = "padellm-ner"
APP_COMPONENTS = {"api", "worker", "beat", "migrate"}
SETTINGS_VARS = {name.upper() for name in Settings.model_fields}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job"}


def kustomize(folder: Path) -> list[dict]:
    """The objects ``kubectl kustomize folder`` renders."""
    done = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Each overlay rendered from a copy of k8s/ whose secret.env files come from the examples."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    tree = tmp_path_factory.mktemp("manifests") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secret.env"))
    for example in tree.rglob("secret.env.example"):
        shutil.copy(example, example.with_suffix(""))
    return {name: kustomize(tree / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(params=OVERLAYS)
def objects(request: pytest.FixtureRequest, rendered: dict[str, list[dict]]) -> list[dict]:
    return rendered[request.param]


def base_name(obj: dict) -> str:
    """The object's name without the content hash kustomize appends to generated ConfigMaps and Secrets."""
    name = obj["metadata"]["name"]
    return name.rsplit("-", 1)[0] if obj["kind"] in {"ConfigMap", "Secret"} else name


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    """The objects of ``kind`` (named ``name``)."""
    return [obj for obj in objects if obj["kind"] == kind and name in {None, base_name(obj)}]


def one(objects: list[dict], kind: str, name: str) -> dict:
    (obj,) = find(objects, kind, name)
    return obj


def pod_templates(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    """(workload name, pod template) of every workload."""
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            yield obj["metadata"]["name"], obj["spec"]["template"]


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def container(objects: list[dict], workload: str, name: str | None = None) -> dict:
    template = dict(pod_templates(objects))[workload]
    return next(c for c in containers(template) if c["name"] == (name or workload))


def command(c: dict) -> list[str]:
    return c.get("command", []) + c.get("args", [])


def matches(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects ``labels``."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def quantity(value: str) -> float:
    """A Kubernetes resource quantity ("250m", "2", "3Gi") as a number."""
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("m", 1e-3)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def test_each_overlay_renders_the_whole_stack(objects):
    (namespace,) = find(objects, "Namespace")
    assert {obj["metadata"].get("namespace") for obj in objects if obj is not namespace} == {namespace["metadata"]["name"]}
    assert {
        ("Deployment", "api"), ("Service", "api"), ("Ingress", "api"), ("PodDisruptionBudget", "api"),
        ("Deployment", "worker"), ("PodDisruptionBudget", "worker"), ("Deployment", "beat"),
        ("Job", "migrate"), ("Deployment", "redis"), ("Service", "redis"),
        ("StatefulSet", "postgres"), ("Service", "postgres"),
        ("ConfigMap", "padellm-ner-config"), ("Secret", "padellm-ner-secrets"),
        ("NetworkPolicy", "default-deny-ingress"),
    } <= {(obj["kind"], base_name(obj)) for obj in objects}
    assert one(objects, "StatefulSet", "postgres")["spec"]["volumeClaimTemplates"]


def test_objects_validate_against_the_kubernetes_schema_offline(objects, monkeypatch):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="install the k8s extra")

    def no_network(*args, **kwargs):
        raise OSError("schema validation must not use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    version = kubernetes_validate.latest_version()
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(map(str, error.path))
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {error.message}", pytrace=False)


def test_every_container_has_requests_and_limits(objects):
    for workload, template in pod_templates(objects):
        for c in containers(template):
            for bound in ("requests", "limits"):
                assert set(c.get("resources", {}).get(bound, {})) >= {"cpu", "memory"}, (workload, c["name"], bound)
                for resource in ("cpu", "memory"):
                    assert quantity(c["resources"]["requests"][resource]) <= quantity(c["resources"]["limits"][resource])


def test_serving_containers_have_readiness_and_liveness_probes(objects):
    for workload, template in pod_templates(objects):
        for c in template["spec"]["containers"]:
            if c.get("ports"):
                assert "readinessProbe" in c and "livenessProbe" in c, (workload, c["name"])
    api = container(objects, "api")
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = int(command(api)[command(api).index("--port") + 1])
    assert {p["name"]: p["containerPort"] for p in api["ports"]}[api["readinessProbe"]["httpGet"]["port"]] == port


def test_images_are_pinned_to_explicit_tags(objects):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for workload, template in pod_templates(objects):
        for c in containers(template):
            name, _, tag = c["image"].rpartition(":")
            assert name and "/" not in tag and tag not in {"", "latest"}, (workload, c["image"])
            if name == APP_IMAGE:
                assert tag == version, f"{c['image']} is not the project version {version}"


def test_application_environment_is_made_of_settings_fields(objects):
    config = one(objects, "ConfigMap", "padellm-ner-config")["data"]
    assert set(config) <= SETTINGS_VARS, set(config) - SETTINGS_VARS
    Settings(**{key.lower(): value for key, value in config.items()})  # every value parses
    secrets = {obj["metadata"]["name"]: obj["data"] for obj in find(objects, "Secret")}
    maps = {obj["metadata"]["name"]: obj["data"] for obj in find(objects, "ConfigMap")}
    seen: dict[str, set[str]] = {}
    for workload, template in pod_templates(objects):
        for c in containers(template):
            if c["image"].startswith(APP_IMAGE + ":"):
                names = {env["name"] for env in c.get("env", [])}
                for source in c.get("envFrom", []):
                    if "configMapRef" in source:
                        names |= set(maps[source["configMapRef"]["name"]])
                    else:
                        names |= set(secrets[source["secretRef"]["name"]])
                assert names <= SETTINGS_VARS, (workload, c["name"], names - SETTINGS_VARS)
                seen[c["name"]] = names
    assert {"NER_MODEL", "NER_API_KEYS", "DATABASE_URL", "REDIS_URL"} <= seen["api"]
    for name in ("worker", "beat"):
        assert {"NER_MODEL", "DATABASE_URL", "REDIS_URL", "NIGHTLY_CRON"} <= seen[name]
    assert {"DATABASE_URL"} <= seen["migrate"] and {"DATABASE_URL"} <= seen["wait-for-migrations"]


def test_commands_are_the_real_entry_points(objects):
    from padellm_ner.cli import build_parser

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    api = command(container(objects, "api"))
    assert api[0] in scripts and api[:2] == ["padellm-ner", "serve"] and api[api.index("--host") + 1] == "0.0.0.0"
    build_parser().parse_args(api[1:])  # a registered sub-command that takes these options
    assert command(container(objects, "worker"))[:4] == ["celery", "-A", "pipeline.celery_app", "worker"]
    assert command(container(objects, "beat"))[:4] == ["celery", "-A", "pipeline.celery_app", "beat"]
    assert importlib.util.find_spec("pipeline.celery_app") is not None
    assert command(container(objects, "migrate")) == ["alembic", "upgrade", "head"]
    alembic = configparser.ConfigParser()
    alembic.read(REPO / "alembic.ini")
    assert (REPO / alembic["alembic"]["script_location"] / "env.py").is_file()
    for workload in ("api", "worker"):  # neither starts before the schema is at head
        assert "alembic current" in " ".join(command(container(objects, workload, "wait-for-migrations")))


def test_beat_is_a_single_replica_replaced_by_recreate(objects):
    beat = one(objects, "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert all(hpa["spec"]["scaleTargetRef"]["name"] != "beat" for hpa in find(objects, "HorizontalPodAutoscaler"))


def test_workers_outlive_a_task_on_shutdown_and_declare_at_least_once(objects):
    worker = one(objects, "Deployment", "worker")
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30  # the Kubernetes default
    semantics = worker["metadata"]["annotations"]["padellm-ner/delivery-semantics"]
    assert "at-least-once" in semantics and "acks_late" in semantics and "idempotent" in semantics


def test_network_policies_expose_only_the_api(objects):
    policies = find(objects, "NetworkPolicy")
    assert any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies), "no default deny"
    templates = dict(pod_templates(objects))
    labels = {workload: template["metadata"]["labels"] for workload, template in templates.items()}
    for workload, pod_labels in labels.items():
        rules = [rule for p in policies if matches(p["spec"]["podSelector"], pod_labels) for rule in p["spec"].get("ingress", [])]
        if any(not rule.get("from") for rule in rules):
            assert workload == "api", f"{workload} is reachable from anywhere"
        if workload in {"postgres", "redis"}:
            assert rules, workload
            for peer in (peer for rule in rules for peer in rule["from"]):
                assert set(peer) == {"podSelector"}, f"{workload} admits {peer}"
                admitted = {w for w, pod_labels in labels.items() if matches(peer["podSelector"], pod_labels)}
                assert {"api", "worker"} <= admitted <= APP_COMPONENTS, (workload, admitted)


def test_every_pod_runs_as_non_root_with_least_privilege(objects):
    for workload, template in pod_templates(objects):
        spec = template["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, workload
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, workload
        assert spec["automountServiceAccountToken"] is False, workload
        for c in containers(template):
            context = c["securityContext"]
            assert context.get("runAsUser", pod["runAsUser"]) != 0
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}, (workload, c["name"])
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert c["image"].split(":")[0] != APP_IMAGE or "/tmp" in mounts, (workload, c["name"])


def test_references_resolve(objects):
    labels = [template["metadata"]["labels"] for _, template in pod_templates(objects)]
    ports = {p["name"] for _, t in pod_templates(objects) for c in t["spec"]["containers"] for p in c.get("ports", [])}
    for service in find(objects, "Service"):
        assert any(matches({"matchLabels": service["spec"]["selector"]}, pod_labels) for pod_labels in labels), service["metadata"]["name"]
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    for path in one(objects, "Ingress", "api")["spec"]["rules"][0]["http"]["paths"]:
        backend = path["backend"]["service"]
        assert backend["port"]["name"] in {p["name"] for p in one(objects, "Service", backend["name"])["spec"]["ports"]}
    for hpa in find(objects, "HorizontalPodAutoscaler"):
        one(objects, hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
    for pdb in find(objects, "PodDisruptionBudget"):
        assert any(matches(pdb["spec"]["selector"], pod_labels) for pod_labels in labels)
    secrets = {obj["metadata"]["name"]: obj["data"] for obj in find(objects, "Secret")}
    for _, template in pod_templates(objects):
        for c in containers(template):
            for env in c.get("env", []):
                if "secretKeyRef" in env.get("valueFrom", {}):
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["key"] in secrets[ref["name"]], ref


def test_dev_is_one_replica_each_and_prod_scales(rendered):
    dev, prod = rendered["dev"], rendered["prod"]
    assert not find(dev, "HorizontalPodAutoscaler")
    assert all(obj["spec"]["replicas"] == 1 for obj in dev if obj["kind"] in {"Deployment", "StatefulSet"})
    (hpa,) = find(prod, "HorizontalPodAutoscaler")
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert "replicas" not in one(prod, "Deployment", "api")["spec"]  # the HPA owns it
    assert one(prod, "Deployment", "worker")["spec"]["replicas"] > 1
    assert one(prod, "Deployment", "beat")["spec"]["replicas"] == 1
    for workload in ("api", "worker", "postgres"):
        small, large = container(dev, workload)["resources"], container(prod, workload)["resources"]
        for bound in ("requests", "limits"):
            assert quantity(small[bound]["memory"]) < quantity(large[bound]["memory"]), (workload, bound)


def test_image_runs_as_non_root_and_defaults_to_the_api(rendered):
    dockerfile = (REPO / "Dockerfile").read_text().splitlines()
    runtime = dockerfile[max(i for i, line in enumerate(dockerfile) if line.startswith("FROM ")):]
    (user,) = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert user.split(":")[0] not in {"0", "root"}
    (cmd,) = [json.loads(line.removeprefix("CMD ")) for line in runtime if line.startswith("CMD ")]
    assert cmd == command(container(rendered["prod"], "api"))
    assert any("COPY alembic.ini" in line for line in runtime)
    # The wheels' bases are converted in the runtime stage, so their cache keys hold at run time.
    assert "RUN padellm-ner prepare" in runtime
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "runs/"} <= ignored


def test_no_real_secret_is_committed():
    prod = K8S / "overlays" / "prod"
    assert yaml.safe_load((prod / "kustomization.yaml").read_text())["secretGenerator"][0]["envs"] == ["secret.env"]
    lines = (prod / "secret.env.example").read_text().splitlines()
    values = [line.split("=", 1)[1] for line in lines if line and not line.startswith("#")]
    assert values and all("REPLACE_ME" in value for value in values)
    dev = yaml.safe_load((K8S / "overlays" / "dev" / "kustomization.yaml").read_text())["secretGenerator"][0]["literals"]
    assert all("placeholder" in literal.split("=", 1)[1] for literal in dev)
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(prod / "secret.env")], cwd=REPO)
    assert ignored.returncode == 0, "k8s/overlays/prod/secret.env must be gitignored"
