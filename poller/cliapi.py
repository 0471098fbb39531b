"""What the user CLI may import from the operator: this module's names, and nothing else.

The CLI (``lmeval``, ``kubectl lmeval``; import package ``lmeval_cli``) is a
distribution of its own, ``lmeval-cli``, which requires ``lmeval-operator`` of
the same version for what both must agree on: the API's models, where and how
results are stored, the job pod's names, the paired statistics. It reads the
operator through this module only, the way the poller reads the driver through
``driver.protocol`` only (both are import contracts in pyproject.toml), so a
change to anything not named here cannot break the CLI, and a change to
anything named here is a change to a published interface.
"""

from __future__ import annotations

from poller import api, buildinfo, timefmt
from poller.api.settings import parse_duration
from poller.decisions.ownership import controller_text, controller_uid
from poller.jobpod.podspec import MAIN_CONTAINER, pod_name
from poller.jobpod.signer import ATTESTATION_KEY, attestation_configmap_name
from poller.kube.errors import ApiError
from poller.results import pairedstats
from poller.results.lmeval import (
    ITEMS_KEY,
    LOG_ARCHIVE_KEY,
    PROVENANCE_KEY,
    RESULTS_GZ_KEY,
    RESULTS_KEY,
    ScoreRow,
    gunzip_base64,
    packed_results_text,
    results_configmap_name,
    score_rows,
)
from poller.timefmt import parse_time

# What each name is for: the API's models, read as api.X (api.LMEvalJobSpec,
# api.JobState; and the suites' names `lmeval suite` reads: api.SUITE_KIND,
# SUITE_PLURAL, SUITE_SHORT_NAME, RUN_REQUESTED_ANNOTATION, SuiteCondition,
# Tier, BaselinePolicy, ConcurrencyPolicy); which build this is (buildinfo);
# times as Kubernetes writes them (timefmt, parse_time); durations as the
# settings and the spec write them (parse_duration); whose a pod or ConfigMap
# is (controller_text, controller_uid); the job pod's name and its main
# container's (pod_name, MAIN_CONTAINER); the apiserver's errors as the
# operator's transport raises them (ApiError); the paired comparison of two
# runs (pairedstats, whose format_p prints a suite's p-values too); a suite run's
# signed verdict's ConfigMap (attestation_configmap_name, ATTESTATION_KEY); the results
# ConfigMap's name, keys and packing, and the score rows of a results JSON.
__all__ = [
    "ATTESTATION_KEY",
    "ITEMS_KEY",
    "LOG_ARCHIVE_KEY",
    "MAIN_CONTAINER",
    "PROVENANCE_KEY",
    "RESULTS_GZ_KEY",
    "RESULTS_KEY",
    "ApiError",
    "ScoreRow",
    "api",
    "attestation_configmap_name",
    "buildinfo",
    "controller_text",
    "controller_uid",
    "gunzip_base64",
    "packed_results_text",
    "pairedstats",
    "parse_duration",
    "parse_time",
    "pod_name",
    "results_configmap_name",
    "score_rows",
    "timefmt",
]
