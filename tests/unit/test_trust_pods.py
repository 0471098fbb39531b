"""Whom the job pod trusts (issue 34): the cluster's CA bundles and each endpoint's own, pure.

Checks of ``poller.api.settings`` (trusted-ca-bundles: NAME/KEY entries, a
broken value keeps the last good one; allow-insecure-storage-endpoints),
``poller.jobpod.trust`` and the modules of the fields that talk TLS, through
``podspec.build_pod``: the picked-up bundles are one projected volume of
optional ConfigMap keys that every TLS client's container mounts and finds
in ``$LMEVAL_CLUSTER_CA_BUNDLES``; each endpoint's caBundle is mounted for
its own client only (the S3 fetch, the OCI push, the Git clone's ``ca``
step, whose file the fetch names in ``http.sslCAInfo``); verifySSL: false is
refused before any pod unless the setting allows it, with a message naming
the field and the setting; a failed Git trust step or an untrusted Git
server's certificate names the field to fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from driver import protocol
from poller import api
from poller.api.settings import Settings, SettingsTracker
from poller.jobpod import gittasks, ocioutput, offline, podspec, trust

OPENSHIFT = "odh-trusted-ca-bundle/ca-bundle.crt, openshift-service-ca.crt/service-ca.crt"
PICKED = Settings.model_validate({"trusted-ca-bundles": OPENSHIFT, "allow-code-execution": "true"})
PLAIN = Settings.model_validate({"allow-code-execution": "true"})
CM = {"configMapKeyRef": {"name": "corp-ca", "key": "ca.crt"}}
SECRET = {"secretKeyRef": {"name": "corp-ca-secret", "key": "ca.pem"}}
REF = {"name": "s3", "key": "k"}
S3 = {"accessKeyId": REF, "secretAccessKey": REF, "bucket": REF, "endpoint": REF}
OCI = {"repository": "registry.example.com/team/evals"}
CLUSTER_FILES = (
    "/opt/lmeval/cluster-ca/odh-trusted-ca-bundle/ca-bundle.crt:"
    "/opt/lmeval/cluster-ca/openshift-service-ca.crt/service-ca.crt"
)


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "dummy", "tasks": ["t"], **fields})


def _pod(spec: api.LMEvalJobSpec, settings: Settings = PLAIN) -> dict[str, Any]:
    return podspec.build_pod(name="j", namespace="ns", uid="u", spec=spec, settings=settings)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    every = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
    found: dict[str, Any] = next(c for c in every if c["name"] == name)
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


# -- the settings ------------------------------------------------------------------


def test_trusted_ca_bundles_are_name_key_entries_each_once() -> None:
    assert PICKED.trusted_ca_bundles == [
        "odh-trusted-ca-bundle/ca-bundle.crt",
        "openshift-service-ca.crt/service-ca.crt",
    ]
    again = Settings.model_validate({"trusted-ca-bundles": "a/x.crt,a/x.crt, b/y ,"})
    assert again.trusted_ca_bundles == ["a/x.crt", "b/y"]
    assert Settings().trusted_ca_bundles == []
    assert Settings().allow_insecure_storage_endpoints is False


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("odh-trusted-ca-bundle", "is not NAME/KEY"),
        ("Upper/ca.crt", "is not NAME/KEY"),
        ("a/b/c", "is not NAME/KEY"),
        ("a/..", "cannot be a file's name"),
        ("a/..x", "cannot be a file's name"),
        (",".join(f"c{i}/k" for i in range(17)), "at most 16"),
    ],
)
def test_a_broken_value_keeps_the_last_good_one(value: str, words: str) -> None:
    tracker = SettingsTracker()
    tracker.update({"trusted-ca-bundles": OPENSHIFT, "poll-interval": "5s"})
    settings = tracker.update({"trusted-ca-bundles": value, "poll-interval": "7s"})
    assert settings.trusted_ca_bundles == PICKED.trusted_ca_bundles
    assert settings.poll_interval == 7.0  # the other keys still take effect
    assert words in tracker.problems["trusted-ca-bundles"], tracker.problems


# -- the cluster's bundles in every job pod ----------------------------------------


def test_every_job_pod_mounts_the_picked_up_bundles_as_optional_keys() -> None:
    pod = _pod(_spec(), PICKED)
    assert _volumes(pod)[trust.CLUSTER_VOLUME] == {
        "name": "cluster-ca",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {
                    "configMap": {
                        "name": "odh-trusted-ca-bundle",
                        "items": [
                            {"key": "ca-bundle.crt", "path": "odh-trusted-ca-bundle/ca-bundle.crt"}
                        ],
                        "optional": True,
                    }
                },
                {
                    "configMap": {
                        "name": "openshift-service-ca.crt",
                        "items": [
                            {
                                "key": "service-ca.crt",
                                "path": "openshift-service-ca.crt/service-ca.crt",
                            }
                        ],
                        "optional": True,
                    }
                },
            ],
        },
    }
    main = _container(pod, podspec.MAIN_CONTAINER)
    assert _mounts(main)[trust.CLUSTER_CA_DIR] == {
        "name": "cluster-ca",
        "mountPath": "/opt/lmeval/cluster-ca",
        "readOnly": True,
    }
    assert _env(main)[protocol.ENV_CLUSTER_CA_BUNDLES] == CLUSTER_FILES
    # A job's own bundle is not needed for them, and not added.
    assert protocol.ENV_CA_BUNDLE not in _env(main)


def test_two_keys_of_one_config_map_are_one_source() -> None:
    settings = Settings.model_validate({"trusted-ca-bundles": "b/one, a/x, b/two"})
    sources = _volumes(_pod(_spec(), settings))["cluster-ca"]["projected"]["sources"]
    assert [
        (s["configMap"]["name"], [i["key"] for i in s["configMap"]["items"]]) for s in sources
    ] == [
        ("b", ["one", "two"]),
        ("a", ["x"]),
    ]


def test_without_the_setting_nothing_is_mounted() -> None:
    pod = _pod(
        _spec(
            offline={"storage": {"s3": S3}},
            outputs={"oci": OCI},
            allowCodeExecution=True,
            customTasks=[{"git": {"url": "https://git.example.com/t.git"}}],
        )
    )
    assert trust.CLUSTER_VOLUME not in _volumes(pod)
    assert gittasks.CA_VOLUME not in _volumes(pod)
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        assert protocol.ENV_CLUSTER_CA_BUNDLES not in _env(container)
        assert trust.CLUSTER_CA_DIR not in _mounts(container)
    # No trust step either: git keeps its own store.
    assert [c["name"] for c in pod["spec"]["initContainers"]][:2] == ["git-0-init", "git-0-fetch"]


# -- each endpoint's own caBundle ----------------------------------------------------


def test_the_s3_fetch_trusts_the_cluster_and_its_own_ca() -> None:
    pod = _pod(_spec(offline={"storage": {"s3": {**S3, "caBundle": SECRET}}}), PICKED)
    assert _volumes(pod)[offline.S3_CA_VOLUME] == {
        "name": "s3-ca",
        "secret": {"secretName": "corp-ca-secret", "items": [{"key": "ca.pem", "path": "ca.crt"}]},
    }
    fetch = _container(pod, offline.FETCH_CONTAINER)
    assert fetch["command"][-1] == "--ca-bundle=/opt/lmeval/s3-ca/ca.crt"
    assert _mounts(fetch)[offline.S3_CA_DIR]["readOnly"] is True
    assert _mounts(fetch)[trust.CLUSTER_CA_DIR]["readOnly"] is True
    assert _env(fetch)[protocol.ENV_CLUSTER_CA_BUNDLES] == CLUSTER_FILES
    # The evaluation does not get the S3 endpoint's CA.
    assert offline.S3_CA_DIR not in _mounts(_container(pod, podspec.MAIN_CONTAINER))


def test_the_oci_push_gets_its_own_ca_as_a_driver_option() -> None:
    pod = _pod(_spec(outputs={"oci": {**OCI, "caBundle": CM}}), PICKED)
    assert _volumes(pod)[ocioutput.CA_VOLUME] == {
        "name": "oci-ca",
        "configMap": {"name": "corp-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    }
    main = _container(pod, podspec.MAIN_CONTAINER)
    assert _mounts(main)[ocioutput.CA_DIR]["readOnly"] is True
    options = main["command"][: main["command"].index("--")]
    assert "--oci-ca-bundle=/opt/lmeval/oci-ca/ca.crt" in options
    assert not [o for o in options if o.startswith("--oci-tls")]


def test_a_git_source_gets_one_ca_file_from_a_job_image_step() -> None:
    git = {"url": "https://git.example.com/t.git", "caBundle": CM}
    pod = _pod(
        _spec(allowCodeExecution=True, customTasks=[{"configMap": "cm"}, {"git": git}]), PICKED
    )
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names[:3] == ["git-1-ca", "git-1-init", "git-1-fetch"]
    step = _container(pod, "git-1-ca")
    assert step["image"] == PICKED.pod_image  # the job image: its driver and authorities
    assert step["securityContext"] == podspec.restricted_container_context()
    assert step["command"] == [
        *podspec.driver_command(PICKED),
        protocol.CMD_CA_BUNDLE,
        "--out=/opt/lmeval/git-ca/1.pem",
        "--ca-bundle=/opt/lmeval/git-source-ca/1/ca.crt",
        "--field=spec.customTasks[1].git.caBundle",
    ]
    assert _mounts(step)[gittasks.CA_ROOT].get("readOnly") is None  # it writes there
    assert _mounts(step)["/opt/lmeval/git-source-ca/1"]["readOnly"] is True
    assert _env(step)[protocol.ENV_CLUSTER_CA_BUNDLES] == CLUSTER_FILES
    assert _volumes(pod)["git-source-ca-1"]["configMap"]["name"] == "corp-ca"
    assert _volumes(pod)[gittasks.CA_VOLUME] == {"name": "git-ca", "emptyDir": {}}
    fetch = _container(pod, "git-1-fetch")
    env = _env(fetch)
    config = {
        env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"]
        for i in range(int(env["GIT_CONFIG_COUNT"]))
    }
    assert config["http.sslCAInfo"] == "/opt/lmeval/git-ca/1.pem"
    assert _mounts(fetch)[gittasks.CA_ROOT]["readOnly"] is True
    # Only the fetch talks to the server.
    for other in ("git-1-init", "git-1-checkout", "git-1-record"):
        assert gittasks.CA_ROOT not in _mounts(_container(pod, other))
        assert "http.sslCAInfo" not in _env(_container(pod, other)).values()
    assert gittasks.is_container_name("git-1-ca")


def test_a_public_git_source_gets_the_cluster_bundles_only_when_picked_up() -> None:
    git = {"url": "https://github.com/org/tasks.git"}
    spec = _spec(allowCodeExecution=True, customTasks=[{"git": git}])
    step = _container(_pod(spec, PICKED), "git-0-ca")
    assert step["command"][-1] == "--out=/opt/lmeval/git-ca/0.pem"
    assert "git-0-ca" not in [c["name"] for c in _pod(spec)["spec"]["initContainers"]]


def test_a_git_source_in_the_clear_has_no_ca() -> None:
    git = {"url": "http://127.0.0.1:9418/t.git", "caBundle": CM}
    with pytest.raises(podspec.JobPodError, match=r"spec.customTasks\[0\].git.caBundle: http://"):
        _pod(_spec(allowCodeExecution=True, customTasks=[{"git": git}]), PICKED)
    # Plain http:// to loopback needs no trust step, setting or not.
    plain = _pod(_spec(allowCodeExecution=True, customTasks=[{"git": {"url": git["url"]}}]), PICKED)
    assert "git-0-ca" not in [c["name"] for c in plain["spec"]["initContainers"]]


# -- verifySSL: false needs the setting --------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "what"),
    [
        (
            {"offline": {"storage": {"s3": {**S3, "verifySSL": False}}}},
            "spec.offline.storage.s3",
            "the S3 endpoint",
        ),
        ({"outputs": {"oci": {**OCI, "verifySSL": False}}}, "spec.outputs.oci", "the registry"),
    ],
)
def test_verification_off_is_refused_unless_the_setting_allows_it(
    fields: dict[str, Any], field: str, what: str
) -> None:
    with pytest.raises(podspec.JobPodError) as caught:
        _pod(_spec(**fields))
    assert str(caught.value) == (
        f"{field}.verifySSL: false turns TLS verification of {what} off, and the poller "
        "settings do not allow that (allow-insecure-storage-endpoints: false in ConfigMap "
        f"lmeval-poller-config); give its CA in {field}.caBundle instead"
    )
    allowed = Settings.model_validate({"allow-insecure-storage-endpoints": "true"})
    pod = _pod(_spec(**fields), allowed)
    words = [
        w
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
        for w in c["command"]
    ]
    assert "--no-verify-ssl" in words or "--oci-tls=insecure" in words


def test_verification_on_or_no_tls_at_all_is_fine() -> None:
    _pod(_spec(offline={"storage": {"s3": {**S3, "verifySSL": True}}}))
    loopback = {"repository": "127.0.0.1:5000/evals", "plainHTTP": True, "verifySSL": False}
    _pod(_spec(outputs={"oci": loopback}))


# -- what a failed clone says --------------------------------------------------------


def _raw(git: dict[str, Any]) -> dict[str, Any]:
    return {"customTasks": [{"git": git}]}


def test_a_failed_trust_step_names_the_bundle() -> None:
    git = {"url": "https://git.example.com/t.git", "caBundle": CM}
    log = (
        "note: trusted-ca-bundles: a/b is not in this namespace (no such ConfigMap or key): "
        "skipped\nspec.customTasks[0].git.caBundle: /opt/lmeval/git-source-ca/0/ca.crt holds no "
        "PEM certificate (-----BEGIN CERTIFICATE-----)\n"
    )
    message = gittasks.clone_failure(_raw(git), "git-0-ca", 1, log)
    assert message == (
        "spec.customTasks[0].git.caBundle: /opt/lmeval/git-source-ca/0/ca.crt holds no PEM "
        "certificate (-----BEGIN CERTIFICATE-----) (gathering the CAs trusted for "
        "https://git.example.com/t.git)"
    )


@pytest.mark.parametrize(
    "log",
    [
        # curl with OpenSSL (alpine/git), then with GnuTLS (Debian's git).
        "fatal: unable to access 'https://git.example.com/t.git/': SSL certificate problem: "
        "unable to get local issuer certificate",
        "fatal: unable to access 'https://git.example.com/t.git/': server certificate "
        "verification failed. CAfile: /opt/lmeval/git-ca/0.pem CRLfile: none",
    ],
)
def test_an_untrusted_git_server_names_the_bundle_and_the_setting(log: str) -> None:
    git = {"url": "https://git.example.com/t.git"}
    message = gittasks.clone_failure(_raw(git), "git-0-fetch", 128, log)
    assert message is not None
    assert message.startswith(
        "spec.customTasks[0].git: fetching https://git.example.com/t.git failed, its "
        "certificate is not trusted ("
    )
    assert message.endswith(
        "give its CA in spec.customTasks[0].git.caBundle, or ask for it in the poller "
        "setting trusted-ca-bundles"
    )
