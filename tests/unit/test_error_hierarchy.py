"""One error hierarchy: the operator, the CLI and the sandbox meet the same `ApiError`.

Checks, without a cluster: the CLI's and the sandbox's API errors are
`poller.kube.errors.ApiError`s with the one `transient` test (5xx and 429),
keep the messages they had, and the cycle's acting re-raises a transient
refusal (the next cycle tries again) while a refusal for good becomes the
apiserver's words.
"""

from __future__ import annotations

import pytest
from lmeval_cli.errors import ApiError as CliApiError
from lmeval_cli.errors import ExitCode, explain
from lmeval_sandbox.podsetup import ApiError as SandboxApiError

from poller.cycle.act import raise_if_transient
from poller.cycle.poison import classify
from poller.kube import errors as apierrors
from poller.kube.client import ApiError


@pytest.mark.parametrize(
    ("status", "transient"), [(500, True), (503, True), (429, True), (422, False), (403, False)]
)
def test_every_api_error_says_whether_it_is_transient_the_same_way(
    status: int, transient: bool
) -> None:
    errors = [
        ApiError(status, "Reason", '{"message": "said"}'),
        CliApiError(status, {"reason": "Reason", "message": "said"}, verb="get", resource="pods"),
        SandboxApiError(status, '{"message": "said"}'),
    ]
    for error in errors:
        assert isinstance(error, apierrors.ApiError)
        assert error.transient is transient


def test_the_cli_and_the_sandbox_keep_their_messages() -> None:
    cli = CliApiError(404, {"reason": "NotFound", "message": " gone "}, verb="get", resource="x")
    assert (str(cli), cli.message, cli.reason) == ("404 NotFound: gone", "gone", "NotFound")
    assert explain(cli).code == ExitCode.NOT_FOUND
    quiet = CliApiError(500, {}, verb="get", resource="x")
    assert quiet.message == "" and quiet.details == {}
    sandbox = SandboxApiError(409, "x" * 600)
    assert str(sandbox) == "HTTP 409: " + "x" * 500


def test_acting_reraises_transient_errors_and_words_refusals() -> None:
    refused = ApiError(422, "Unprocessable Entity", '{"message": "data: Too long"}')
    raise_if_transient(refused)  # a refusal for good: worded, not raised
    assert refused.message == "data: Too long"
    busy = ApiError(503, "Service Unavailable")
    with pytest.raises(ApiError) as raised:
        raise_if_transient(busy)
    assert raised.value is busy
    assert classify(busy) == "transient" and classify(refused) == "poison"
