"""Hostile settings: one bad value never stops the poller (issue 15, class 4).

Checks, on `SettingsTracker` and `parse_duration` alone: every hostile value
(YAML syntax errors, nesting deeper than MAX_YAML_DEPTH, anchors and aliases
including an alias bomb, Python tags, values over MAX_VALUE_CHARS, nan, inf,
1e309, magnitudes over each key's upper bound, non-string values) is refused
for its key alone, with a problem naming the key and the reason, while that
key keeps its last good value and the other keys take theirs; `update` never
raises, not even where the old code did (size-presets removed while
default-size names one of its presets); keys that must change together
(size-presets and default-size) do; 10,000 junk keys cost at most
MAX_PROBLEMS_LISTED + 1 log lines, once, and bounded memory, while
`problem_count` counts them all; and, as a hypothesis property, any text for
any key leaves a valid Settings equal to the last good one unless that text
is itself a good value for the key.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poller.api import settings as settings_module
from poller.api.settings import (
    MAX_PROBLEMS_LISTED,
    MAX_VALUE_CHARS,
    MAX_YAML_DEPTH,
    Settings,
    SettingsTracker,
    load_plain_yaml,
    parse_duration,
)

GOOD = {
    "poll-interval": "2s",
    "progress-interval": "45s",
    "pod-pending-timeout": "5m",
    "max-running-jobs": "7",
    "progress-reads-per-cycle": "20",
    "default-ttl-seconds-after-finished": "3600",
    "size-presets": "small: {requests: {cpu: '1'}}\nlarge: {limits: {nvidia.com/gpu: '1'}}",
    "default-size": "small",
    "gpu-resource-names": "nvidia.com/gpu",
    "allow-online": "true",
}

# Ten levels of nine aliases: ~200 bytes of YAML, 9**10 nodes once walked.
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)

HOSTILE: list[tuple[str, str, str]] = [
    ("size-presets", "small: {requests: {cpu: '1'", "invalid YAML"),
    ("size-presets", "[" * 60_000, f"nested deeper than {MAX_YAML_DEPTH} levels"),
    ("size-presets", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 40)), "nested deeper"),
    ("size-presets", ALIAS_BOMB, "anchors and aliases are not allowed"),
    ("size-presets", "small: &s {requests: {cpu: '1'}}", "anchors and aliases are not allowed"),
    ("size-presets", "!!python/object/apply:os.system ['true']", "could not determine"),
    ("size-presets", "small: {requests: {cpu: .inf}}", "String should match pattern"),
    ("size-presets", "x" * (MAX_VALUE_CHARS + 1), f"at most {MAX_VALUE_CHARS}"),
    ("poll-interval", "1e309", "not a finite number"),
    ("poll-interval", "nan", "not a finite number"),
    ("poll-interval", "-inf", "not a finite number"),
    ("poll-interval", "1" * 60_000, "at most 64"),
    ("progress-interval", "1e309", "not a finite number"),
    ("progress-interval", "25h", "less than or equal to 86400"),
    ("pod-pending-timeout", "infinity", "not a finite number"),
    ("pod-pending-timeout", "999999999999h", "less than or equal to 604800"),
    ("max-running-jobs", "1e309", "valid integer"),
    ("max-running-jobs", "9" * 60_000, "integer"),
    ("max-running-jobs", "100001", "less than or equal to 100000"),
    ("progress-reads-per-cycle", "1001", "less than or equal to 1000"),
    ("default-ttl-seconds-after-finished", "99999999999999999999", "less than or equal"),
    ("log-archive-bytes", "nan", "valid integer"),
    ("default-size", "huge", "not in size-presets"),
    ("pod-image", " registry.example/x:1", "String should match pattern"),
    ("driver-image", "registry.example/x:1\nmore", "String should match pattern"),
    ("pod-image", "r/" + "x" * 2000, "at most 1024 characters"),
]


def _tracker() -> tuple[SettingsTracker, Settings]:
    tracker = SettingsTracker()
    good = tracker.update(GOOD)
    assert tracker.problem_count == 0, tracker.problems
    assert good.default_size == "small" and good.poll_interval == 2
    return tracker, good


@pytest.mark.parametrize(("key", "value", "reason"), HOSTILE, ids=lambda v: str(v)[:30])
def test_a_hostile_value_is_refused_and_its_key_keeps_the_last_good_value(
    key: str, value: str, reason: str
) -> None:
    tracker, good = _tracker()
    assert tracker.update({**GOOD, key: value}) == good
    assert list(tracker.problems) == [key] and tracker.problem_count == 1
    assert reason in tracker.problems[key]
    assert "keeping" in tracker.problems[key]
    # The problem quotes the value, never all of it.
    assert len(tracker.problems[key]) < 1000


def test_the_other_keys_still_take_their_new_values() -> None:
    tracker, _ = _tracker()
    current = tracker.update({**GOOD, "size-presets": ALIAS_BOMB, "poll-interval": "9s"})
    assert current.poll_interval == 9
    assert set(current.size_presets) == {"small", "large"}


@pytest.mark.parametrize(
    "bad", ["nan", "inf", "-inf", "1e309", "Infinity", float("inf"), float("nan"), "9" * 400]
)
def test_durations_must_be_finite(bad: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("key", "largest", "too_large"),
    [
        ("poll-interval", "1h", "3601s"),
        ("progress-interval", "24h", "86401s"),
        ("pod-pending-timeout", "168h", "168h1s"),
        ("progress-reads-per-cycle", "1000", "1001"),
        ("max-running-jobs", "100000", "100001"),
        ("default-ttl-seconds-after-finished", "31536000", "31536001"),
        ("log-archive-bytes", "524288", "524289"),
    ],
)
def test_every_number_has_an_upper_bound(key: str, largest: str, too_large: str) -> None:
    tracker = SettingsTracker()
    accepted = tracker.update({key: largest})
    assert tracker.problem_count == 0
    assert tracker.update({key: too_large}) == accepted
    assert "less than or equal to" in tracker.problems[key]


def test_anchors_are_refused_by_the_loader_itself() -> None:
    assert load_plain_yaml("a: {b: [1, 2]}") == {"a": {"b": [1, 2]}}
    with pytest.raises(ValueError, match="anchors and aliases are not allowed"):
        load_plain_yaml(ALIAS_BOMB)
    with pytest.raises(ValueError, match="line 2, column 4"):
        load_plain_yaml("a: 1\nb: *x")
    depth_ok = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    assert load_plain_yaml(depth_ok) is not None
    with pytest.raises(ValueError, match="nested deeper"):
        load_plain_yaml("[" + depth_ok + "]")


def test_values_of_any_type_and_broken_parsers_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker, good = _tracker()
    odd: dict[Any, Any] = {**GOOD, "poll-interval": None, "max-running-jobs": 3, 7: b"x"}
    assert tracker.update(odd) == good
    assert "not a string" in tracker.problems["poll-interval"]
    assert set(tracker.problems) == {"poll-interval", "max-running-jobs", "7"}

    def broken(text: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    # Any exception a parser raises is its key's problem, not the cycle's.
    monkeypatch.setattr(Settings, "model_validate", classmethod(lambda cls, v: broken(v)))
    assert tracker.update({**GOOD, "poll-interval": "3s"}) == good
    assert "RecursionError" in tracker.problems["poll-interval"]


def test_removing_presets_that_default_size_names_keeps_both() -> None:
    # The old tracker raised here: it reset size-presets to {} unchecked and
    # then validated default-size "small" against no presets.
    tracker, good = _tracker()
    without = {k: v for k, v in GOOD.items() if k != "size-presets"}
    assert tracker.update(without) == good
    assert tracker.problems["size-presets"].startswith("removed, but")
    assert tracker.problem_count == 1


def test_size_presets_and_default_size_change_together() -> None:
    tracker, _ = _tracker()
    renamed = {**GOOD, "size-presets": "tiny: {requests: {cpu: 100m}}", "default-size": "tiny"}
    current = tracker.update(renamed)
    assert current.default_size == "tiny" and set(current.size_presets) == {"tiny"}
    assert tracker.problem_count == 0


def test_junk_keys_are_counted_but_logged_and_kept_in_bounded_numbers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker, good = _tracker()
    junk = {**GOOD, **{f"junk-{i}": "x" * 100 for i in range(10_000)}}
    with caplog.at_level(logging.WARNING, logger=settings_module.__name__):
        assert tracker.update(junk) == good
        first = len(caplog.records)
        assert tracker.update(dict(junk)) == good  # unchanged: nothing new
        junk["junk-0"] = "changed"
        tracker.update(junk)
    assert tracker.problem_count == 10_000
    assert len(tracker.problems) == MAX_PROBLEMS_LISTED
    assert first == MAX_PROBLEMS_LISTED + 1
    assert "9900 more unknown keys" in caplog.records[-1].getMessage()
    assert len(caplog.records) == first  # the same problems are not logged again
    assert len(tracker._reported) <= MAX_PROBLEMS_LISTED


def test_a_bad_value_is_logged_once_while_it_lasts(caplog: pytest.LogCaptureFixture) -> None:
    tracker, _ = _tracker()
    with caplog.at_level(logging.WARNING, logger=settings_module.__name__):
        for _ in range(3):
            tracker.update({**GOOD, "poll-interval": "1e309"})
            tracker.update({**GOOD, "poll-interval": "1e309", "allow-online": "false"})
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "setting poll-interval in ConfigMap lmeval-poller-config"
    ]


# Any text, with a bias to what parsers trip on.
_TEXTS = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        ["nan", "inf", "1e309", "-1", "0", "1.5", "&a x", "*a", "[[[", "{a: }", "yes", "", " "]
    ),
    st.from_regex(r"[0-9]{1,30}(\.[0-9]{1,5})?(ms|s|m|h|e[0-9]{1,4})?", fullmatch=True),
    st.builds(
        lambda names, cpu: "\n".join(f"{n}: {{requests: {{cpu: {cpu}}}}}" for n in names),
        st.lists(st.from_regex(r"[a-z]{1,5}", fullmatch=True), max_size=3),
        st.sampled_from(["'1'", "1", ".inf", "100m", "-1", "[1]"]),
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(Settings.keys())), text=_TEXTS)
def test_any_text_for_any_key_never_raises_and_keeps_the_last_good_value(
    key: str, text: str
) -> None:
    tracker, good = _tracker()
    result = tracker.update({**GOOD, key: text})
    assert isinstance(result, Settings)
    Settings.model_validate(result.model_dump(by_alias=True))  # still valid as a whole
    if key in tracker.problems:
        assert result == good
    else:
        assert tracker.problem_count == 0
        assert result == Settings.model_validate({**GOOD, key: text})
    for field in ("poll_interval", "progress_interval", "pod_pending_timeout"):
        assert math.isfinite(getattr(result, field))
