"""Where the tests find the checkout's files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
VECTORS = ROOT / "tests" / "vectors"  # test vectors shared with the SDKs' suites
EXAMPLES = ROOT / "examples"
