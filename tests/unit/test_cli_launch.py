"""The console scripts without the `cli` extra: one line naming what to install.

Checks: with the kubernetes client or rich missing, `lmeval` exits 7 and its
stderr names the missing packages and the extra, without importing the CLI;
with them present it runs the CLI (its help).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from lmeval_cli import launch


def test_missing_cli_packages_are_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def without_rich(name: str, package: str | None = None) -> object:
        return None if name == "rich" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_rich)
    monkeypatch.delitem(sys.modules, "lmeval_cli.__main__", raising=False)
    assert launch.main() == 7
    err = capsys.readouterr().err
    assert "rich" in err and "kubernetes" not in err
    assert "pip install 'lmeval-poller[cli]'" in err
    assert "lmeval_cli.__main__" not in sys.modules


def test_with_the_packages_it_runs_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch.missing_packages() == []
    monkeypatch.setattr(sys, "argv", ["lmeval", "--help"])
    with pytest.raises(SystemExit) as exited:
        launch.main()
    assert exited.value.code == 0
    assert "exit codes:" in capsys.readouterr().out
