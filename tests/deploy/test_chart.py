"""The Helm chart ``deploy/helm/lmeval-poller`` is the kustomize manifests, templated.

Checks, with a real Helm (built from its Go module) and the sandbox's
kubectl, no cluster: the committed chart is what ``python -m
lmeval_sandbox.chart`` generates from ``deploy/`` and ``--check`` notices an
altered copy; ``helm lint --strict`` is clean; the built Helm reports its
pinned version. One source of truth: ``helm template`` renders, object for
object, what kustomize renders (only Helm's labels and the keep policy
removed) with the default values, with ``openshift.enabled``, with
``metrics.enabled`` (also both at once), and the ``jobNamespaces`` objects
are the job-namespace component rendered for each namespace. The values do
what they say: another namespace leaves no mention of lmeval-system,
admission policies can be left out, image digests give ``@sha256:``
references, settings land in the ConfigMap as strings, the pod's scheduling
fields and resources reach the Deployment without touching its selector, and
the schema refuses wrong types, unknown keys and bad names before anything
renders. The generator also takes an older tree's ``deploy/`` (settings in
the ConfigMap's data, no job-image variable), and `set_image_defaults` pins
the release's images by digest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import chart, helm

from poller import api
from poller.api.settings import CONFIGMAP_NAME, Settings
from tests.deploy.conftest import DEPLOY, OVERLAYS, POLLER_NS, REPO, Manifest, documents, kustomize

CHART = chart.CHART_DIR
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
KEEP = "helm.sh/resource-policy"
DIGEST = "sha256:" + "0123456789abcdef" * 4
Key = tuple[str, str, str]


@pytest.fixture(scope="session")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Helm's cache/config/data for this session (never ~)."""
    helm.ensure_helm()
    return tmp_path_factory.mktemp("helm-home")


def _helm(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return helm.run_helm(*args, home=home, check=check)


def _template(
    home: Path, *args: str, chart_dir: Path = CHART, namespace: str = POLLER_NS
) -> list[Manifest]:
    done = _helm(home, "template", "lmeval", str(chart_dir), "--namespace", namespace, *args)
    return documents(done.stdout)


def _key(doc: Manifest) -> Key:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def _without_helm(docs: Iterable[Manifest]) -> dict[Key, Manifest]:
    """The objects, keyed, after checking and removing what only Helm adds."""
    out: dict[Key, Manifest] = {}
    for doc in docs:
        meta = doc["metadata"]
        labels = meta.get("labels", {})
        assert set(labels) >= HELM_LABELS, f"{_key(doc)} lacks Helm's labels: {labels}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        for label in HELM_LABELS:
            del labels[label]
        if not labels:
            del meta["labels"]
        annotations = meta.get("annotations", {})
        annotations.pop(KEEP, None)
        if "annotations" in meta and not annotations:
            del meta["annotations"]
        out[_key(doc)] = doc
    return out


def _keyed(docs: Iterable[Manifest]) -> dict[Key, Manifest]:
    return {_key(doc): doc for doc in docs}


def _assert_same(helm_docs: list[Manifest], kustomize_docs: list[Manifest]) -> None:
    rendered, expected = _without_helm(helm_docs), _keyed(kustomize_docs)
    assert set(rendered) == set(expected)
    for key, doc in expected.items():
        assert rendered[key] == doc, f"{key} differs from kustomize's"


def _overlay_with(directory: Path, base: Path, components: Iterable[Path]) -> Path:
    """A throwaway kustomization: `base` plus `components`."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, directory)],
        "components": [os.path.relpath(c, directory) for c in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(body))
    return directory


def _job_namespace(kubectl: Path, directory: Path, name: str) -> list[Manifest]:
    """deploy/components/job-namespace for `name`, as deploy/examples does it."""
    directory.mkdir(parents=True)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    (directory / "namespace.yaml").write_text(yaml.safe_dump(namespace))
    body = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": name,
        "resources": ["namespace.yaml"],
        "components": [os.path.relpath(DEPLOY / "components" / "job-namespace", directory)],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(body))
    return documents(kustomize(kubectl, directory))


def _deployment(docs: list[Manifest]) -> Manifest:
    (found,) = [d for d in docs if d["kind"] == "Deployment"]
    return found


def _container(docs: list[Manifest]) -> Manifest:
    container: Manifest = _deployment(docs)["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: Manifest, name: str) -> Any:
    (value,) = [e["value"] for e in container["env"] if e["name"] == name]
    return value


# -- generated, and checked against drift --------------------------------------------------


def test_committed_chart_is_what_deploy_gives() -> None:
    assert chart.check_chart() == [], "run `python -m lmeval_sandbox.chart`"
    assert chart.main(["--check"]) == 0


def test_check_notices_an_altered_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "lmeval-poller"
    shutil.copytree(CHART, copy)
    assert chart.main(["--check", "--out", str(copy)]) == 0
    values = copy / "values.yaml"
    values.write_text(values.read_text().replace("replicas: 1", "replicas: 2"))
    (copy / "templates" / "extra.yaml").write_text("{}\n")
    assert chart.main(["--check", "--out", str(copy)]) == 1
    message = capsys.readouterr().err
    assert "out of date" in message
    assert "values.yaml" in message and "templates/extra.yaml" in message
    assert "python -m lmeval_sandbox.chart" in message


def test_chart_metadata() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["type"] == "application"
    assert meta["name"] == "lmeval-poller"
    assert meta["version"] == meta["appVersion"] == chart.project_version()
    assert not (CHART / "crds").exists(), "the CRD belongs in templates/ so upgrades update it"


def test_helm_is_the_pinned_release(helm_home: Path) -> None:
    done = _helm(helm_home, "version", "--template", "{{ .Version }}")
    assert done.stdout.strip() == helm.helm_version() == "v4.3.2"


def test_lint_strict_is_clean(helm_home: Path) -> None:
    done = _helm(helm_home, "lint", "--strict", str(CHART), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


# -- one source of truth -------------------------------------------------------------------


def test_defaults_render_the_kubernetes_overlay(helm_home: Path, kubectl_bin: Path) -> None:
    expected = documents(kustomize(kubectl_bin, OVERLAYS["kubernetes"]))
    _assert_same(_template(helm_home, "--set", "namespace.create=true"), expected)
    # Helm's convention: the namespace comes from `helm install -n --create-namespace`.
    without = [d for d in expected if d["kind"] != "Namespace"]
    _assert_same(_template(helm_home), without)


def test_openshift_renders_the_openshift_overlay(helm_home: Path, kubectl_bin: Path) -> None:
    expected = documents(kustomize(kubectl_bin, OVERLAYS["openshift"]))
    docs = _template(helm_home, "--set", "namespace.create=true,openshift.enabled=true")
    _assert_same(docs, expected)


@pytest.mark.parametrize("variant", ["kubernetes", "openshift"])
def test_metrics_render_the_metrics_component(
    helm_home: Path, kubectl_bin: Path, tmp_path: Path, variant: str
) -> None:
    overlay = _overlay_with(tmp_path / "overlay", OVERLAYS[variant], [DEPLOY / "metrics"])
    expected = documents(kustomize(kubectl_bin, overlay))
    openshift = variant == "openshift"
    switches = f"namespace.create=true,metrics.enabled=true,openshift.enabled={openshift}"
    docs = _template(helm_home, "--set", switches)
    _assert_same(docs, expected)
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    # The alert texts keep Prometheus' own {{ $value }} templates.
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert "{{ $value" in json.dumps(rule)


def test_metrics_switches(helm_home: Path) -> None:
    docs = _template(helm_home, "--set", "metrics.enabled=true,metrics.prometheusRule=false")
    kinds = [d["kind"] for d in docs]
    assert "ServiceMonitor" in kinds and "PrometheusRule" not in kinds
    assert any(d["metadata"]["name"] == "lmeval-poller-dashboard" for d in docs)
    off = _template(helm_home, "--set", "metrics.serviceMonitor=true")
    assert "ServiceMonitor" not in [d["kind"] for d in off], "metrics.enabled gates every switch"


@pytest.mark.parametrize("create", [False, True])
def test_job_namespaces_are_the_component(
    helm_home: Path, kubectl_bin: Path, tmp_path: Path, create: bool
) -> None:
    base = _keyed(_template(helm_home))
    docs = _template(
        helm_home, "--set", f"jobNamespaces={{team-a,team-b}},createJobNamespaces={create}"
    )
    extra = [d for d in docs if _key(d) not in base]
    expected = [
        doc
        for name in ("team-a", "team-b")
        for doc in _job_namespace(kubectl_bin, tmp_path / name, name)
        if create or doc["kind"] != "Namespace"
    ]
    assert expected, "the component renders nothing"
    for doc in extra:
        if doc["kind"] == "Namespace":
            # Users' jobs live there: uninstalling must not delete it.
            assert doc["metadata"]["annotations"][KEEP] == "keep"
    _assert_same(extra, expected)


# -- what the values do --------------------------------------------------------------------


def test_namespace_follows_the_value_everywhere(helm_home: Path) -> None:
    docs = _template(helm_home, "--set", "namespace.name=evals,namespace.create=true")
    assert POLLER_NS not in json.dumps(docs)
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        assert namespace in (None, "evals"), _key(doc)
        for subject in doc.get("subjects", []):
            assert subject.get("namespace", "evals") == "evals"
    assert ("Namespace", "", "evals") in _keyed(docs)
    claims = json.dumps([d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"])
    assert "system:serviceaccount:evals:lmeval-poller" in claims
    # Without namespace.name, the release's namespace.
    released = _template(helm_home, "--set", "metrics.enabled=true", namespace="ml-tools")
    assert POLLER_NS not in json.dumps(released)
    assert {d["metadata"].get("namespace") for d in released} == {None, "ml-tools"}


def test_admission_policies_can_be_left_out(helm_home: Path) -> None:
    docs = _template(helm_home, "--set", "admissionPolicies.enabled=false")
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert {"Deployment", "CustomResourceDefinition", "ClusterRole"} <= kinds


def test_image_references(helm_home: Path) -> None:
    default = _container(_template(helm_home))
    assert default["image"] == "quay.io/lmeval-poller/lmeval-poller:latest"
    assert _env(default, chart.JOB_IMAGE_ENV) == "quay.io/lmeval-poller/lmeval-job:latest"
    pinned = _container(
        _template(
            helm_home,
            "--set",
            f"image.digest={DIGEST},image.registry=registry.example:5000,image.tag=v9",
            "--set",
            f"jobImage.digest={DIGEST},jobImage.repository=mirror/job",
            "--set",
            "image.pullPolicy=Always",
        )
    )
    assert pinned["image"] == f"registry.example:5000/lmeval-poller/lmeval-poller@{DIGEST}"
    assert _env(pinned, chart.JOB_IMAGE_ENV) == f"quay.io/mirror/job@{DIGEST}"
    assert pinned["imagePullPolicy"] == "Always"
    tagged = _container(_template(helm_home, "--set", "image.tag=1.2.3,image.registry="))
    assert tagged["image"] == "lmeval-poller/lmeval-poller:1.2.3"


def test_settings_are_strings_in_the_configmap(helm_home: Path, tmp_path: Path) -> None:
    default = [d for d in _template(helm_home) if d["metadata"]["name"] == CONFIGMAP_NAME]
    assert "data" not in default[0], "no key is set by default: the ConfigMap is the users'"
    values = tmp_path / "values.yaml"
    # A values file's numbers reach the templates as floats (1e+06 if printed as they are).
    given = {"finished-sweep-jobs": 1000000, "allow-online": True, "size-presets": "{}"}
    values.write_text(yaml.safe_dump({"settings": given}))
    docs = _template(
        helm_home,
        "-f",
        str(values),
        "--set",
        "settings.max-running-jobs=5",
        "--set-string",
        "settings.poll-interval=30s",
    )
    (configmap,) = [d for d in docs if d["metadata"]["name"] == CONFIGMAP_NAME]
    assert configmap["data"] == {
        "finished-sweep-jobs": "1000000",
        "allow-online": "true",
        "size-presets": "{}",
        "max-running-jobs": "5",
        "poll-interval": "30s",
    }
    # Every value really is a string, as a ConfigMap needs (and as the poller reads it).
    settings = Settings.model_validate(configmap["data"])
    assert settings.max_running_jobs == 5 and settings.finished_sweep_jobs == 1000000


def test_every_setting_is_documented_in_values() -> None:
    text = (CHART / "values.yaml").read_text()
    assert yaml.safe_load(text)["settings"] == {}
    readme = (CHART / "README.md").read_text()
    for key in Settings.keys():  # noqa: SIM118 (a classmethod, not a dict)
        assert f"# {key}:" in text, f"values.yaml does not list setting {key}"
        assert f"| `{key}` |" in readme, f"README.md does not list setting {key}"


def test_pod_fields_reach_the_deployment(helm_home: Path, tmp_path: Path) -> None:
    default = _deployment(_template(helm_home))
    values = tmp_path / "values.yaml"
    overrides = {
        "replicas": 2,
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "pull"}],
    }
    values.write_text(yaml.safe_dump(overrides))
    deployment = _deployment(_template(helm_home, "-f", str(values)))
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["containers"][0]["resources"] == overrides["resources"]
    for name in overrides.keys() - {"replicas", "resources"}:
        assert pod[name] == overrides[name]
        assert name not in default["spec"]["template"]["spec"]
    # Upgrades keep working only while the selector and the pod's labels stay as kustomize has them.
    assert deployment["spec"]["selector"] == default["spec"]["selector"]
    assert deployment["spec"]["template"]["metadata"] == default["spec"]["template"]["metadata"]
    assert not HELM_LABELS & set(deployment["spec"]["template"]["metadata"]["labels"])
    assert "--leader-elect" in pod["containers"][0]["args"]


def test_crd_survives_uninstall(helm_home: Path) -> None:
    crds = [d for d in _template(helm_home) if d["kind"] == "CustomResourceDefinition"]
    assert {crd["metadata"]["name"] for crd in crds} == {
        f"{api.PLURAL}.{api.API_GROUP}",
        f"{api.SUITE_PLURAL}.{api.API_GROUP}",
    }
    for crd in crds:
        assert crd["metadata"]["annotations"][KEEP] == "keep"


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--set", "replicas=foo"], "/replicas"),
        (["--set", "replica=2"], "replica"),
        (["--set", "image.digest=latest"], "/image/digest"),
        (["--set", "namespace.name=Not_A_Name"], "/namespace/name"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "jobNamespaces={a,a}"], "/jobNamespaces"),
        (["--set-json", 'settings={"poll-interval": ["10s"]}'], "/settings/poll-interval"),
        (["--set", "metrics.enabled=yes-please"], "/metrics/enabled"),
    ],
)
def test_schema_refuses_bad_values(helm_home: Path, flags: list[str], complaint: str) -> None:
    done = _helm(helm_home, "template", "lmeval", str(CHART), *flags, check=False)
    assert done.returncode != 0
    assert "schema" in done.stderr and complaint in done.stderr, done.stderr


# -- other trees, and the release's images -------------------------------------------------


def _older_tree(root: Path) -> Path:
    """deploy/ and crds/ as an older release had them: every setting in the
    ConfigMap's data, and no job-image variable in the Deployment."""
    shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("helm", "sandbox"))
    shutil.copytree(REPO / "crds", root / "crds")
    settings = root / "deploy" / "base" / "settings.yaml"
    settings.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: lmeval-poller-config\n"
        "  namespace: lmeval-system\ndata:\n"
        '  # How often a cycle runs.\n  poll-interval: "10s"\n'
        "  # Image of the evaluation container.\n"
        '  pod-image: "quay.io/lmeval-poller/lmeval-job:0.1.0"\n'
        '  # Cluster-wide switches.\n  allow-online: "false"\n  allow-code-execution: "false"\n'
    )
    deployment = root / "deploy" / "base" / "deployment.yaml"
    body = yaml.safe_load(deployment.read_text())
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != chart.JOB_IMAGE_ENV]
    deployment.write_text(yaml.safe_dump(body))
    return root / "deploy"


def test_an_older_tree_gives_its_settings_as_defaults(
    helm_home: Path, kubectl_bin: Path, tmp_path: Path
) -> None:
    deploy = _older_tree(tmp_path / "tree")
    out = tmp_path / "chart" / "lmeval-poller"
    chart.generate_chart(deploy, out, version="0.1.0", app_version="0.1.0", kubectl=kubectl_bin)
    assert _helm(helm_home, "lint", "--strict", str(out), check=False).returncode == 0
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert "jobImage" not in values
    assert values["settings"]["pod-image"] == "quay.io/lmeval-poller/lmeval-job:0.1.0"
    # The comments above each key stay with it.
    assert "# How often a cycle runs." in (out / "values.yaml").read_text()
    expected = documents(kustomize(kubectl_bin, deploy / "overlays" / "kubernetes"))
    _assert_same(_template(helm_home, "--set", "namespace.create=true", chart_dir=out), expected)

    poller = f"registry.example/rel/lmeval-poller@{DIGEST}"
    job = f"registry.example/rel/job@{DIGEST}"
    chart.set_image_defaults(out, poller=poller, job=job)
    docs = _template(helm_home, chart_dir=out)
    assert _container(docs)["image"] == poller
    (configmap,) = [d for d in docs if d["metadata"]["name"] == CONFIGMAP_NAME]
    assert configmap["data"]["pod-image"] == job
    assert configmap["data"]["poll-interval"] == "10s"


def test_set_image_defaults_pins_both_images(helm_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "lmeval-poller"
    shutil.copytree(CHART, out)
    chart.set_image_defaults(
        out,
        poller=f"registry.example:5000/rel/lmeval-poller@{DIGEST}",
        job=f"registry.example:5000/rel/lmeval-job@{DIGEST}",
    )
    container = _container(_template(helm_home, chart_dir=out))
    assert container["image"] == f"registry.example:5000/rel/lmeval-poller@{DIGEST}"
    assert _env(container, chart.JOB_IMAGE_ENV) == f"registry.example:5000/rel/lmeval-job@{DIGEST}"
    readme = (out / "README.md").read_text()
    assert f'| `image.digest` | `"{DIGEST}"` |' in readme
    assert '| `jobImage.registry` | `"registry.example:5000"` |' in readme
    assert _helm(helm_home, "lint", "--strict", str(out), check=False).returncode == 0
