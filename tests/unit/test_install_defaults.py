"""Install-time defaults: the Deployment's environment beneath the ConfigMap.

Checks `install_defaults` and `SettingsTracker(defaults=...)`: the release's
job image (LMEVAL_DEFAULT_POD_IMAGE) is the effective pod-image before any
ConfigMap is read and while the ConfigMap sets none; a pod-image in the
ConfigMap wins; removing it returns to the install default, not to the
built-in one; a malformed install default is refused like a bad key (the
built-in default stays, the problem names the key); unrelated environment
variables and empty values give nothing.
"""

from __future__ import annotations

from poller.api.settings import INSTALL_DEFAULT_ENV, Settings, SettingsTracker, install_defaults

RELEASE_JOB_IMAGE = "registry.example/lmeval/lmeval-job:0.2.0@sha256:" + "a" * 64


def test_only_the_named_variables_count_and_empty_ones_do_not() -> None:
    environ = {INSTALL_DEFAULT_ENV["pod-image"]: RELEASE_JOB_IMAGE, "POLL_INTERVAL": "1s"}
    assert install_defaults(environ) == {"pod-image": RELEASE_JOB_IMAGE}
    assert install_defaults({INSTALL_DEFAULT_ENV["pod-image"]: ""}) == {}


def test_the_install_default_holds_until_the_configmap_sets_the_key() -> None:
    tracker = SettingsTracker({"pod-image": RELEASE_JOB_IMAGE})
    assert tracker.current.pod_image == RELEASE_JOB_IMAGE  # before the first read
    assert tracker.update(None).pod_image == RELEASE_JOB_IMAGE  # no ConfigMap
    assert tracker.update({"poll-interval": "2s"}).pod_image == RELEASE_JOB_IMAGE
    mine = "mirror.example/lmeval-job:pinned"
    assert tracker.update({"pod-image": mine}).pod_image == mine
    # The key removed again: back to the release's image, not the built-in one.
    assert tracker.update({"poll-interval": "2s"}).pod_image == RELEASE_JOB_IMAGE
    assert tracker.problem_count == 0


def test_a_malformed_install_default_is_refused_for_its_key_alone() -> None:
    tracker = SettingsTracker({"pod-image": "not an image; rm -rf /"})
    assert tracker.current.pod_image == Settings().pod_image
    assert "pod-image" in tracker.problems
    assert tracker.update({"poll-interval": "3s"}).poll_interval == 3.0
