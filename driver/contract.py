"""The light half of the driver-poller contract: names, numbers, the command line.

Why a module of its own: :mod:`driver.protocol` is the whole contract and
re-exports everything here, but it is imported only after lm_eval has started
(it pulls in ``dataclasses`` and ``json``). What the driver needs *before* the
child starts (its exit codes, the names of its markers, its options and
environment variables) lives here, importing nothing at all, so that the
driver's start-up stays as fast as it was. Outside the driver's start-up
path, import these names from :mod:`driver.protocol`.

The command line is built by :func:`run_argv` from one table, `RunArgs`, and
:func:`release_argv` (the poller's pod spec uses them), and parsed by
``driver.__main__`` into the same names, so an option renamed on one side is
renamed on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

__all__ = [
    "ATTESTATION_PREDICATE_TYPE",
    "ATTEST_MODULE",
    "CMD_CA_BUNDLE",
    "CMD_DECODE",
    "CMD_FETCH_S3",
    "CMD_RELEASE",
    "DRIVER_MODULE",
    "DRIVER_PROGRAM",
    "END_OF_OPTIONS",
    "ENV_CA_BUNDLE",
    "ENV_CLUSTER_CA_BUNDLES",
    "ENV_OUTPUT_ROOT",
    "ENV_RUN_ID",
    "ENV_SAFE_PATH",
    "ENV_TERMINATION_LOG",
    "EVENT_CANCELLED",
    "EVENT_COMPLETED",
    "EVENT_FAILED",
    "EVENT_ITEMS",
    "EVENT_PROGRESS",
    "EVENT_RESULTS",
    "EVENT_STARTED",
    "EXIT_CANCELLED",
    "EXIT_DRIVER_ERROR",
    "EXIT_NO_RESULTS",
    "EXIT_OK",
    "EXIT_SHARD_REFUSED",
    "MAX_SHARDS",
    "OPT_OUTPUT_ROOT",
    "SHARDS_RECORD",
    "SHARD_MODULE",
    "RunArgs",
    "attest_argv",
    "ca_bundle_argv",
    "driver_command",
    "fetch_s3_argv",
    "option_flag",
    "release_argv",
    "run_argv",
    "shard_merge_argv",
    "shard_run_argv",
]

# Exit codes of the driver. A child that exits with N != 0 makes the driver
# exit N; a child killed by signal S makes it exit 128 + S (the shell
# convention, so an OOM kill shows as 137 whichever process was killed).
EXIT_OK = 0
EXIT_NO_RESULTS = 70
EXIT_CANCELLED = 71
EXIT_DRIVER_ERROR = 72
# Beside a merged results file: what each shard contributed (driver.shardmerge
# writes it; the merge pod's driver reports it in its final marker's provenance).
SHARDS_RECORD = "shards.json"
# A shard's child (driver.shards) refused the job before any request (too few
# documents, sampled generation, ...; argparse's own code for bad arguments):
# running it again would refuse again, so the poller fails the job at once.
EXIT_SHARD_REFUSED = 2

# The ``event`` of each marker; the payload of each is typed in driver.protocol.
EVENT_STARTED: Final = "started"
EVENT_PROGRESS: Final = "progress"
EVENT_RESULTS: Final = "results"
EVENT_ITEMS: Final = "items"  # per-item scores (driver.itemscores), chunked like results
EVENT_COMPLETED: Final = "completed"
EVENT_FAILED: Final = "failed"
EVENT_CANCELLED: Final = "cancelled"

# How the driver is invoked: its console script, or ``python -m driver`` when
# the package was copied into an image that does not have it installed.
DRIVER_PROGRAM = "lmeval-driver"
DRIVER_MODULE = "driver"

# Sub-commands (the run itself has none: options, then ``--``, then lm_eval).
CMD_DECODE = "decode"
CMD_RELEASE = "release"
CMD_FETCH_S3 = "fetch-s3"
CMD_CA_BUNDLE = "ca-bundle"
END_OF_OPTIONS = "--"


# The options of a run: one table, `RunArgs`, whose field names are the
# options (``output_root`` is ``--output-root``). `run_argv` writes them,
# ``driver.__main__`` parses them back into the same names (with the help,
# types and defaults it shows) and tests/driver/test_contract.py checks that
# the parser's options are exactly this table's.
class RunArgs(NamedTuple):
    """What the poller asks of one run; None leaves the driver's default."""

    # Where the run writes, how it ends, how often it reports (the order of the
    # fields is the order of the options in the pod's command).
    output_root: str | None = None
    grace_period: float | None = None
    hold_seconds: float | None = None
    log_copy: str | None = None
    progress_interval: float | None = None
    run_id: str | None = None
    # A directory of <name>.commit files, one per task source cloned from Git
    # before the driver started (the poller's init containers write them): the
    # driver reports each name and commit in its started and final markers.
    task_sources: str | None = None
    hub_datasets: str | None = None
    # spec.outputs.oci: push the results to host[:port]/path:tag after the run
    # (driver.ocipush), optionally attached to the manifest digest oci_subject,
    # with the credentials of a .dockerconfigjson file; oci_scheme="http" only
    # for a loopback registry; oci_ca_bundle: the registry's own CAs (a PEM
    # file, beside the image's and the cluster's), oci_tls="insecure" when the
    # poller allowed the job to skip verifying the registry's certificate.
    oci_push: str | None = None
    oci_subject: str | None = None
    oci_auth: str | None = None
    oci_scheme: str | None = None
    oci_ca_bundle: str | None = None
    oci_tls: str | None = None
    # spec.outputs.mlflow: log the run to the tracking server mlflow_tracking_uri
    # after the run (driver.mlflowexport), in experiment mlflow_experiment, as
    # run mlflow_run_name with the tags of the JSON object mlflow_tags; the
    # credentials are files of the directory mlflow_credentials (username,
    # password, token), mlflow_ca_bundle the server's own CAs (a PEM file).
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str | None = None
    mlflow_run_name: str | None = None
    mlflow_tags: str | None = None
    mlflow_credentials: str | None = None
    mlflow_ca_bundle: str | None = None


def option_flag(field: str) -> str:
    """The command-line flag of a `RunArgs` field: ``output_root`` -> ``--output-root``."""
    return "--" + field.replace("_", "-")


# The flag ``release`` shares with a run (the pod's output root).
OPT_OUTPUT_ROOT: Final = option_flag("output_root")

# Environment variables the driver reads: defaults of --output-root (the pod
# sets it, so that ``release`` through exec finds the same root) and --run-id.
ENV_OUTPUT_ROOT = "LMEVAL_OUTPUT_ROOT"
ENV_RUN_ID = "LMEVAL_RUN_ID"
# A PEM file of extra CAs for the model endpoint (spec.modelTLS.caBundle): the
# driver adds it to the image's own and points the child's HTTP clients at
# the result (driver.trust).
ENV_CA_BUNDLE = "LMEVAL_CA_BUNDLE"
# The PEM files of the cluster's CA bundles (the poller setting
# trusted-ca-bundles), ':'-separated, each <dir>/<ConfigMap>/<key> and
# optional: every TLS client of the pod trusts them too (driver.trust).
ENV_CLUSTER_CA_BUNDLES = "LMEVAL_CLUSTER_CA_BUNDLES"
# Where a shard writes its termination message when not /dev/termination-log
# (the sandbox's local runner, which plays the kubelet, sets it per container).
ENV_TERMINATION_LOG = "LMEVAL_TERMINATION_LOG"
# Python's switch that keeps the working directory (and a script's) off the
# front of sys.path: the driver sets it for the child whatever its argv says,
# since lm_eval's working directory may be a view of a shared cache.
ENV_SAFE_PATH = "PYTHONSAFEPATH"


def driver_command(python: str | None = None) -> list[str]:
    """The words that start the driver: its script, or ``<python> -m driver``."""
    return [DRIVER_PROGRAM] if python is None else [python, "-m", DRIVER_MODULE]


def _option(flag: str, value: object) -> str:
    # One ``--flag=value`` token: whatever the value holds, it cannot be read
    # as another option. Numbers are written as Python prints them (20, 2.5).
    return f"{flag}={value}"


def run_argv(command: Sequence[str], child_argv: Sequence[str], args: RunArgs) -> list[str]:
    """The argv of one run: `command` (see :func:`driver_command`), the options
    `args` gives (the driver's defaults for the others), ``--`` and the child's argv."""
    given = [
        _option(option_flag(field), value)
        for field, value in zip(RunArgs._fields, args, strict=True)
        if value is not None
    ]
    return [*command, *given, END_OF_OPTIONS, *child_argv]


def release_argv(command: Sequence[str], output_root: str | None = None) -> list[str]:
    """The argv that ends an exec-mode hold (``$LMEVAL_OUTPUT_ROOT`` by default)."""
    root = [] if output_root is None else [_option(OPT_OUTPUT_ROOT, output_root)]
    return [*command, CMD_RELEASE, *root]


def fetch_s3_argv(
    command: Sequence[str],
    dest: str,
    path: str,
    verify_ssl: bool = True,
    ca_bundle: str | None = None,
) -> list[str]:
    """The argv that copies S3 prefix `path` into `dest` (the fetch-storage init
    container); `ca_bundle`: the endpoint's own CAs, a PEM file."""
    argv = [*command, CMD_FETCH_S3, _option("--dest", dest), _option("--path", path)]
    if ca_bundle is not None:
        argv.append(_option("--ca-bundle", ca_bundle))
    return argv if verify_ssl else [*argv, "--no-verify-ssl"]


def ca_bundle_argv(
    command: Sequence[str], out: str, ca_bundle: str | None = None, field: str | None = None
) -> list[str]:
    """The argv that writes one PEM file `out` with the image's, the cluster's and
    `ca_bundle`'s authorities (`field`: the spec field that gave `ca_bundle`)."""
    argv = [*command, CMD_CA_BUNDLE, _option("--out", out)]
    if ca_bundle is not None:
        argv.append(_option("--ca-bundle", ca_bundle))
    if field is not None:
        argv.append(_option("--field", field))
    return argv


# Sharded jobs (spec.parallelism N above 1): each shard pod's driver runs
# `shard_run_argv` as its child instead of ``python -P -m lm_eval``, the merge
# pod's driver `shard_merge_argv` (driver/shards.py; the driver appends
# ``--output_path`` as for any child). `root` is the directory on the job's
# claim that all its shards and the merge share. The child exits 2, with one
# line on stderr and in the termination message file, for a job it refuses.
SHARD_MODULE = "driver.shards"
MAX_SHARDS = 32


def shard_run_argv(index: int, count: int, root: str, lm_eval_args: Sequence[str]) -> list[str]:
    """The child argv of shard `index` (0-based) of `count`; `lm_eval_args` as for lm_eval."""
    return [
        "python",
        "-P",
        "-m",
        SHARD_MODULE,
        "run",
        _option("--index", index),
        _option("--count", count),
        _option("--root", root),
        END_OF_OPTIONS,
        *lm_eval_args,
    ]


def shard_merge_argv(count: int, root: str, lm_eval_args: Sequence[str]) -> list[str]:
    """The child argv of the merge of `count` shards; `lm_eval_args` as for lm_eval."""
    return [
        "python",
        "-P",
        "-m",
        SHARD_MODULE,
        "merge",
        _option("--count", count),
        _option("--root", root),
        END_OF_OPTIONS,
        *lm_eval_args,
    ]


# A suite's signed verdict (spec.attestation): the poller's signing pod runs
# `attest_argv` (driver/attest.py), which signs the statement file with the
# key file and prints one line, {"envelope": <DSSE envelope>, "pushed":
# <manifest digest or null>}, that the poller reads from the pod's log
# (`driver.protocol.parse_attestation_output`). Every option is one token.
ATTEST_MODULE = "driver.attest"
ATTESTATION_PREDICATE_TYPE = "https://foundation-model-stack.github.com/lmeval/suite-verdict/v1"


def attest_argv(
    *,
    statement: str,
    key: str,
    statement_sha256: str | None = None,
    password_file: str | None = None,
    push: str | None = None,
    registry_credentials: str | None = None,
    plain_http: bool = False,
) -> list[str]:
    """The signing pod's command: sign `statement` with `key` (and push it beside `push`)."""
    argv = [
        "python",
        "-P",
        "-m",
        ATTEST_MODULE,
        _option("--statement", statement),
        _option("--key", key),
    ]
    if statement_sha256 is not None:
        argv.append(_option("--statement-sha256", statement_sha256))
    if password_file is not None:
        argv.append(_option("--password-file", password_file))
    if push is not None:
        argv.append(_option("--push", push))
        if registry_credentials is not None:
            argv.append(_option("--registry-credentials", registry_credentials))
        if plain_http:
            argv.append("--plain-http")
    return argv
