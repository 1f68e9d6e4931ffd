"""`make docs-check` (scripts/docs_check.py) over a fixture tree: every kind of link and
path it accepts, and every kind of problem it reports, with its file and line."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

FIXTURE = ROOT / "tests" / "docs" / "fixtures" / "docs_check"
SCRIPT = ROOT / "scripts" / "docs_check.py"

sys.path.insert(0, str(ROOT / "scripts"))

import docs_check  # noqa: E402


def test_reports_each_missing_file_section_and_path_with_its_line():
    problems = [p for f in docs_check.doc_files(FIXTURE) for p in docs_check.check_file(FIXTURE, f)]
    assert problems == [
        "README.md:8: link to a missing file: docs/missing.md",
        "README.md:8: link to a missing section: docs/guide.md#no-such-section",
        "README.md:9: link to a missing section: #nowhere",
        "README.md:9: names a path that does not exist: gateway/metrics.py",
        "README.md:9: names a path that does not exist: bench/gone.py",
    ]


def test_the_command_fails_on_problems_and_passes_without_them(tmp_path):
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(FIXTURE)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "5 problem(s)" in bad.stdout
    assert "README.md:9: names a path that does not exist: bench/gone.py" in bad.stderr
    good = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(FIXTURE), str(FIXTURE / "docs" / "guide.md")],
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr


def test_anchors_follow_githubs_rule():
    assert docs_check.slug("The reader guard (qos/policy/reader.py)") == (
        "the-reader-guard-qospolicyreaderpy"
    )
    assert docs_check.slug("SDK → gateway: `telemetry`") == "sdk--gateway-telemetry"
    assert docs_check.slug("Worker processes (gateway/runtime/engine_server.py)") == (
        "worker-processes-gatewayruntimeengine_serverpy"
    )
    assert docs_check.slug("**Bold** and [a link](x.md)") == "bold-and-a-link"
    assert docs_check.anchors(FIXTURE / "docs" / "guide.md") == {
        "guide",
        "the-relay-gatewayrealpy",
        "repeated",
        "repeated-1",
        "sdk--gateway-telemetry",
    }
