"""The LMEvalSuite API: an evaluation that re-runs when its model changes, and its verdict.

Why a second kind: a platform team does not evaluate a model once. A suite
holds what every run shares (``spec.template``, an LMEvalJob spec), the
criteria each run is judged by (a task's score against the baseline's, in
tiers), the rule that chooses the baseline, and the triggers that start a
run (a schedule with the semantics of a Kubernetes CronJob, a new revision
of a KServe InferenceService, a request by hand). The poller creates each
run as an LMEvalJob the suite owns (`poller.decisions.suites`), compares it
with the baseline per criterion with the regression gate's paired test, and
records a verdict (Passed, Regressed or Inconclusive) with the numbers in
``status.runs`` and as conditions (`kubectl wait --for=condition=Passed`).

Like ``poller.api.lmevaljob``, these models are the source of the CRD
(``crds/lmevalsuites.yaml``) and are checked again by pydantic when the
poller reads a suite, so that a suite which slipped past an older schema
gets a status naming the field instead of runs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue, model_validator

from poller.api import rules
from poller.api.base import DATA_KEY, DNS_SUBDOMAIN, TASK_NAME, SecretKeyRef, _Model
from poller.api.gate import DEFAULT_GATE_METRIC, GATE_METRIC
from poller.api.lmevaljob import LMEvalJobSpec
from poller.api.sources import OCI_LOOPBACK
from poller.api.status import Condition

__all__ = [
    "CRON",
    "MAX_CRITERIA",
    "MAX_RUNS_KEPT",
    "RUN_REQUESTED_ANNOTATION",
    "SUITE_KIND",
    "SUITE_LABEL",
    "SUITE_NAME_MAX",
    "SUITE_PLURAL",
    "SUITE_SHORT_NAME",
    "Attestation",
    "AttestationPush",
    "AttestationStatus",
    "BaselinePolicy",
    "BaselineRule",
    "ConcurrencyPolicy",
    "Criterion",
    "CriterionStatus",
    "InferenceServiceRef",
    "LMEvalSuiteSpec",
    "LMEvalSuiteStatus",
    "ModelChangeTrigger",
    "RunStatus",
    "Schedule",
    "SuiteCondition",
    "Tier",
    "Triggers",
]

SUITE_KIND = "LMEvalSuite"
SUITE_PLURAL = "lmevalsuites"
SUITE_SHORT_NAME = "lmes"
# A run is named <suite>-<8 hex>, and a job's pod <run>-<6 hex>: a suite name
# this short keeps every name the poller derives within 63 characters.
SUITE_NAME_MAX = 40
# The label every run carries (its value: the suite's name), and the annotation
# that asks for a run by hand (`lmeval suite run NAME`): a new value, a new run.
SUITE_LABEL = "lmeval.foundation-model-stack.github.com/suite"
RUN_REQUESTED_ANNOTATION = "lmeval.foundation-model-stack.github.com/run-requested"
MAX_CRITERIA = 32
# status.runs keeps at most this many entries, whatever the history limits say:
# the status is one object in etcd.
MAX_RUNS_KEPT = 50
# Five fields of a crontab line, each made of the characters cron's syntax uses
# (the schema's first check; APScheduler's parser is the exact one), or a macro.
_CRON_FIELD = r"[0-9A-Za-z*/,?-]+"
_CRON_MACRO = r"@(yearly|annually|monthly|weekly|daily|midnight|hourly)"
CRON = rf"^({_CRON_MACRO}|{_CRON_FIELD}( {_CRON_FIELD}){{4}})$"


class Tier(StrEnum):
    """How much a criterion counts in the suite's verdict."""

    MUST = "Must"  # a regression fails the suite; no power or no comparison: Inconclusive
    SHOULD = "Should"  # reported as a warning (PassedWithWarnings), never fails the suite
    INFO = "Info"  # recorded only


class ConcurrencyPolicy(StrEnum):
    """What a trigger does while a run is still going (a CronJob's concurrencyPolicy)."""

    FORBID = "Forbid"
    REPLACE = "Replace"
    ALLOW = "Allow"


class SuiteCondition(StrEnum):
    """A suite's conditions, in the order they are kept."""

    VALID = "Valid"  # the spec parses (False: status.message names the field)
    RUNNING = "Running"  # a run goes on
    PASSED = "Passed"  # the latest verdict is Passed
    REGRESSED = "Regressed"  # the latest verdict is Regressed


class BaselinePolicy(StrEnum):
    LAST_PASSED = "LastPassed"
    PINNED = "Pinned"


class Criterion(_Model):
    """One score of one task that a run must not lose against its baseline."""

    task: Annotated[str, Field(pattern=TASK_NAME, max_length=256)] = Field(
        description="The task compared: one of spec.template.tasks, or a task of a group in "
        "it; at most 256 characters."
    )
    metric: Annotated[str, Field(pattern=GATE_METRIC, max_length=128)] = Field(
        default=DEFAULT_GATE_METRIC,
        description="The score compared, as lm_eval's results key <metric>,<filter> "
        f"(default {DEFAULT_GATE_METRIC}).",
    )
    max_drop: Annotated[float, Field(gt=0, le=1e9)] = Field(
        description="The largest acceptable drop in the metric's units (0.05 is five points "
        "of accuracy), above 0: the suite also checks that the run has enough documents to "
        "detect a drop this large (see power)."
    )
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.05,
        description="Significance level of the paired test (default 0.05): a drop counts "
        "only when its p-value is below it.",
    )
    power: Annotated[float, Field(ge=0.5, lt=1)] = Field(
        default=0.8,
        description="The probability with which a drop of maxDrop must be detectable at the "
        "run's document count (default 0.8, from 0.5 to below 1); with fewer documents the "
        "criterion is Inconclusive (Underpowered), never Passed.",
    )
    higher_is_better: bool = Field(
        default=True,
        description="Whether a higher value is better (default true; false for perplexity).",
    )
    tier: Tier = Field(
        default=Tier.MUST,
        description="Must (default): a regression makes the suite Regressed, and no verdict "
        "(too few documents, not comparable) makes it Inconclusive. Should: reported as a "
        "warning (reason PassedWithWarnings). Info: recorded only.",
    )


class Schedule(_Model):
    """Runs on a schedule, with the semantics of a Kubernetes CronJob."""

    cron: Annotated[str, Field(pattern=CRON, max_length=128)] = Field(
        description="When to run, in cron syntax (minute hour day-of-month month "
        'day-of-week, e.g. "0 3 * * *"; or @daily, @hourly...), parsed by APScheduler\'s '
        "cron trigger; at most 128 characters."
    )
    time_zone: Annotated[str, Field(pattern=r"^[A-Za-z0-9_+/-]{1,64}$")] = Field(
        default="UTC",
        description="The IANA time zone the schedule is read in (default UTC), e.g. Europe/Berlin.",
    )
    starting_deadline_seconds: Annotated[int, Field(ge=1, le=31_536_000)] | None = Field(
        default=None,
        description="A scheduled time missed by more than this (the poller was down, or "
        "concurrencyPolicy Forbid held it) is skipped; unset: a missed time still runs, "
        "once, whenever it can (as a CronJob without startingDeadlineSeconds).",
    )


class InferenceServiceRef(_Model):
    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = Field(
        description="A KServe InferenceService (serving.kserve.io/v1beta1) in the suite's "
        "namespace."
    )


class ModelChangeTrigger(_Model):
    """Runs when the model behind an endpoint changes."""

    inference_service: InferenceServiceRef = Field(
        description="Run when this InferenceService's ready revision changes "
        "(status.components.predictor.latestReadyRevision, else status.url); the run "
        "records the revision it was started for."
    )


class Triggers(_Model):
    """What starts a run, besides a request by hand (`lmeval suite run NAME`)."""

    schedule: Schedule | None = Field(default=None, description="A cron schedule.")
    model_change: ModelChangeTrigger | None = Field(
        default=None, description="A new revision of the model's InferenceService."
    )


class BaselineRule(_Model):
    """Which earlier job each run is compared with."""

    policy: BaselinePolicy = Field(
        default=BaselinePolicy.LAST_PASSED,
        description="LastPassed (default): the latest run of this suite whose verdict was "
        "Passed and whose evaluation settings (tasks, few-shot, limit, generation and chat "
        "settings) equal the template's, else pinned. Pinned: always pinned.",
    )
    pinned: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="An LMEvalJob in the suite's namespace (e.g. the evaluation of the "
        "model in production): the baseline before any run passed, or always with policy "
        "Pinned. The admission policy refuses a suite whose author may not get it. Without "
        "it, the first run has no baseline and is Inconclusive (NoBaseline).",
    )


class AttestationPush(_Model):
    """Where the signed verdict goes besides the cluster: the model artifact's registry."""

    reference: Annotated[
        str, Field(pattern=r"^[a-z0-9][a-z0-9.:-]*(/[a-z0-9._-]+)+@sha256:[0-9a-f]{64}$")
    ] = Field(
        description="The model artifact, by digest (registry/repository@sha256:...): the "
        "attestation's subject, pushed beside it as cosign stores attestations (tag "
        "sha256-<digest>.att, and an OCI 1.1 referrer)."
    )
    credentials_secret: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="A Secret of type kubernetes.io/dockerconfigjson with the registry's "
        "credentials, as spec.outputs.oci.credentialsSecret.",
    )
    plain_http: bool | None = Field(
        default=None,
        alias="plainHTTP",
        description="Talk plain HTTP instead of HTTPS (default false): only for a loopback "
        "registry (127.0.0.1 or localhost), as spec.outputs.oci.plainHTTP.",
    )


def _push_plain_http_problem(push: AttestationPush) -> str | None:
    host = push.reference.split("/", 1)[0].rsplit(":", 1)[0]
    if push.plain_http and host not in OCI_LOOPBACK:
        return "plainHTTP is allowed only for a loopback registry (127.0.0.1 or localhost)"
    return None


AttestationPushSpec = Annotated[
    AttestationPush,
    rules.Cel(
        rule="!has(self.plainHTTP) || !self.plainHTTP || "
        "self.reference.matches('^(127\\\\.0\\\\.0\\\\.1|localhost)(:[0-9]+)?/')",
        message="plainHTTP is allowed only for a loopback registry (127.0.0.1 or localhost)",
        problem=_push_plain_http_problem,
    ),
]


class Attestation(_Model):
    """Sign every verdict (in-toto statement in a DSSE envelope), verifiable with cosign."""

    signing_key: SecretKeyRef = Field(
        description="The Secret key holding the signing key (a PEM PKCS#8 ECDSA P-256 "
        "private key). It is mounted only into the short-lived signing pod, never read by "
        "the poller; the admission policy refuses a suite whose author may not get it."
    )
    password_key: Annotated[str, Field(pattern=DATA_KEY, max_length=253)] | None = Field(
        default=None,
        description="The key, in signingKey's Secret, of the signing key's password: "
        "cosign's own key format (`cosign generate-key-pair`: cosign.key, with "
        "COSIGN_PASSWORD here) or an encrypted PKCS#8 key; unset for a key without one.",
    )
    push: AttestationPushSpec | None = Field(
        default=None, description="Also push the attestation to the model's registry."
    )


_TEMPLATE_RULES: list[dict[str, JsonValue]] = [
    {
        "rule": "!has(self.template.baseline) && !has(self.template.gate)",
        "message": "spec.template may not set baseline or gate: the suite chooses each run's "
        "baseline (spec.baseline) and judges it by spec.criteria",
        "fieldPath": ".template",
    },
    {
        "rule": "!has(self.template.cancel) && !has(self.template.suspend)",
        "message": "spec.template may not set cancel or suspend: use spec.suspend",
        "fieldPath": ".template",
    },
    {
        "rule": "!has(self.baseline) || self.baseline.policy != 'Pinned' || "
        "has(self.baseline.pinned)",
        "message": "spec.baseline.policy Pinned needs spec.baseline.pinned",
        "fieldPath": ".baseline",
    },
]


def template_problem(spec: LMEvalSuiteSpec) -> str | None:
    """The pydantic twin of the CEL rules above (one message, the first)."""
    template = spec.template
    if template.baseline is not None or template.gate is not None:
        return str(_TEMPLATE_RULES[0]["message"])
    if template.cancel is not None or template.suspend is not None:
        return str(_TEMPLATE_RULES[1]["message"])
    if spec.baseline.policy == BaselinePolicy.PINNED and spec.baseline.pinned is None:
        return str(_TEMPLATE_RULES[2]["message"])
    return None


class LMEvalSuiteSpec(_Model):
    """What every run evaluates, how each is judged, and what starts one."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "What every run evaluates (template), how each run is judged "
            "against its baseline (criteria, baseline), and what starts a run (triggers, or "
            "`lmeval suite run NAME`).",
            rules.VALIDATIONS: list(_TEMPLATE_RULES),
        }
    )

    @model_validator(mode="after")
    def _template_fits(self) -> LMEvalSuiteSpec:
        if (problem := template_problem(self)) is not None:
            raise ValueError(problem)
        return self

    template: LMEvalJobSpec = Field(
        description="The LMEvalJob spec every run gets (its tasks name every criterion's "
        "task); without baseline, gate, cancel and suspend, which the suite decides. Each "
        "run also keeps per-sample outputs (logSamples), which the comparison needs."
    )
    criteria: Annotated[list[Criterion], Field(min_length=1, max_length=MAX_CRITERIA)] = Field(
        description=f"What a run is judged by, 1 to {MAX_CRITERIA} scores in tiers."
    )
    baseline: BaselineRule = Field(
        default_factory=BaselineRule,
        description="Which earlier job each run is compared with (default: the last run "
        "that passed).",
    )
    triggers: Triggers = Field(
        default_factory=Triggers,
        description="What starts a run, besides `lmeval suite run NAME` (which sets the "
        f"annotation {RUN_REQUESTED_ANNOTATION} to a new value).",
    )
    concurrency_policy: ConcurrencyPolicy = Field(
        default=ConcurrencyPolicy.FORBID,
        description="When a trigger fires while a run is going: Forbid (default: wait for "
        "it; a scheduled time past startingDeadlineSeconds is skipped), Replace (delete the "
        "running one, start the new one) or Allow (run both).",
    )
    passing_runs_history_limit: Annotated[int, Field(ge=0, le=20)] = Field(
        default=3,
        description="Passed runs kept (default 3, at most 20); older ones are deleted, "
        "except the one that is the current baseline.",
    )
    failing_runs_history_limit: Annotated[int, Field(ge=0, le=20)] = Field(
        default=1,
        description="Finished runs that did not pass (Regressed, Inconclusive, Failed) kept "
        "(default 1, at most 20).",
    )
    suspend: bool = Field(
        default=False,
        description="No new runs while true (default false); a run going on goes on.",
    )
    attestation: Attestation | None = Field(
        default=None,
        description="Sign each verdict as an in-toto attestation (DSSE envelope), kept in "
        "a ConfigMap beside the run and optionally pushed to the model's registry.",
    )


class CriterionStatus(_Model):
    """One criterion's outcome in one run."""

    task: str = Field(description="spec.criteria[].task.")
    metric: str = Field(description="spec.criteria[].metric.")
    tier: str = Field(description="spec.criteria[].tier.")
    verdict: str = Field(description="Passed, Regressed or Inconclusive.")
    reason: str = Field(
        description="Regressed, NotRegressed, Underpowered, NotComparable or NoItemScores."
    )
    message: str = Field(default="", description="The numbers, in one line (default empty).")
    p_value: float | None = Field(default=None, description="The paired test's p-value.")
    difference: float | None = Field(default=None, description="Run minus baseline.")
    paired: int | None = Field(default=None, description="Documents both runs scored.")
    minimum_detectable_drop: float | None = Field(
        default=None,
        description="The smallest drop the test detects with spec.criteria[].power at "
        "this many documents; above maxDrop, the criterion is Underpowered.",
    )


class AttestationStatus(_Model):
    """Where a run's signed verdict is."""

    state: str = Field(
        description="Signing (the signing pod runs), Signed, or Failed (message says why)."
    )
    config_map: str | None = Field(
        default=None, description="The ConfigMap holding the DSSE envelope (envelope.json)."
    )
    payload_digest: str | None = Field(
        default=None, description="sha256 of the signed statement, as sha256:<hex>."
    )
    subject: str | None = Field(
        default=None,
        description="What the statement is about: the model artifact "
        "(registry/repository@sha256:...), else the InferenceService revision or the run.",
    )
    pushed: str | None = Field(
        default=None, description="The attestation manifest's digest in the registry."
    )
    message: str | None = Field(default=None, description="Why signing or pushing failed.")


class RunStatus(_Model):
    """One run of the suite: why it started, what it was compared with, its verdict."""

    name: str = Field(description="The LMEvalJob of this run.")
    uid: str | None = Field(default=None, description="Its UID.")
    trigger: str = Field(description="Schedule, ModelChange or Manual.")
    scheduled_time: str | None = Field(
        default=None, description="The schedule's time it ran for (RFC 3339)."
    )
    revision: str | None = Field(
        default=None, description="The model revision it was started for (ModelChange)."
    )
    started: str = Field(description="When the poller created it (RFC 3339).")
    finished: str | None = Field(default=None, description="When its verdict was recorded.")
    state: str = Field(
        description="Active (running), Finished (a verdict is recorded) or Failed (the "
        "job did not succeed; no verdict)."
    )
    verdict: str | None = Field(default=None, description="Passed, Regressed or Inconclusive.")
    reason: str | None = Field(
        default=None,
        description="The verdict's reason (Passed, PassedWithWarnings, Regressed, "
        "Underpowered, NotComparable, NoItemScores, NoBaseline, BaselineMissing) or the "
        "job's failure reason.",
    )
    message: str | None = Field(default=None, description="The verdict's or failure's words.")
    baseline: str | None = Field(default=None, description="The job it was compared with.")
    baseline_uid: str | None = Field(default=None, description="That job's UID.")
    spec_digest: str | None = Field(
        default=None,
        description="sha256 of the evaluation settings a baseline must share (tasks, "
        "few-shot, limit, generation and chat settings).",
    )
    criteria: list[CriterionStatus] = Field(
        default_factory=list, description="Each criterion's outcome."
    )
    attestation: AttestationStatus | None = Field(
        default=None, description="The signed verdict (spec.attestation)."
    )


class LMEvalSuiteStatus(_Model):
    """Written only by the poller."""

    observed_generation: int | None = Field(
        default=None, description="The spec generation last acted on."
    )
    last_schedule_time: str | None = Field(
        default=None, description="The last scheduled time a run was created for (RFC 3339)."
    )
    last_model_revision: str | None = Field(
        default=None, description="The model revision the last ModelChange run was for."
    )
    last_run_request: str | None = Field(
        default=None, description=f"The last value of {RUN_REQUESTED_ANNOTATION} acted on."
    )
    runs_started: int | None = Field(
        default=None,
        description="How many triggers were handled: part of each run's name, so that a "
        "trigger seen again (a model rolled back) gets a run of its own.",
    )
    last_verdict: str | None = Field(
        default=None, description="The latest recorded verdict (the Verdict column)."
    )
    active: list[str] = Field(default_factory=list, description="Runs going on.")
    message: str | None = Field(
        default=None, description="What happened last, or what is wrong with the spec."
    )
    runs: Annotated[list[RunStatus], Field(max_length=MAX_RUNS_KEPT)] = Field(
        default_factory=list, description="The runs kept (history limits), oldest first."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Valid (the spec parses), Running (a run goes on), Passed and Regressed "
        "(the latest verdict: `kubectl wait --for=condition=Passed`).",
    )
