"""`tokenpace bench qoe --help` says what each option defaults to and names the
latency profiles and policies there are."""

from __future__ import annotations

import pytest

from qos.latency import PROFILES
from qos.policy.registry import POLICIES
from tokenpace.cli import main


def test_help_names_the_profiles_policies_and_defaults(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as done:
        main(["bench", "qoe", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in [*PROFILES, *POLICIES]:
        assert name in text.replace("- ", "-")
    for default in ("default: opt-66b-4xa100", "default: 1.5,2,2.5,3,3.5,4", "default: poisson"):
        assert default in text
    assert "default: results/qoe" in text and "default: 0)" in text


def test_an_unknown_profile_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["bench", "qoe", "--profile", "gpt-9"])
    err = capsys.readouterr().err
    assert "invalid choice: 'gpt-9'" in err and "opt-66b-4xa100" in err
