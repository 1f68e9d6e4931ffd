"""Write the gateway's default tier table, which both SDKs pace to without headers.

``gateway.config.DEFAULT_TIERS`` (and a tenant's default tier) are the reference
(docs/protocol.md, "QoE tiers"). Each SDK keeps one copy (``tokenpace_client.tiers``,
``sdk_web/src/tiers.ts``); the web SDK checks its copy against
``tests/vectors/tiers.json``, and ``tests/test_sdk_tiers.py`` checks the Python copy and
the committed file against the gateway's table. Rewrite the file after changing it:

    .venv/bin/python scripts/make_tier_vectors.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.config.schema import DEFAULT_TIERS, TenantConfig

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "tiers.json"


def build() -> dict[str, Any]:
    return {
        "about": (
            "The gateway's default tiers, generated from gateway.config by "
            "scripts/make_tier_vectors.py; do not edit. ttft: expected time to first token "
            "(s); tds: expected token delivery speed (tokens/s); default: a tenant's default tier."
        ),
        "default": TenantConfig.model_fields["default_tier"].default,
        "tiers": {name: {"ttft": t.ttft, "tds": t.tds} for name, t in DEFAULT_TIERS.items()},
    }


def main() -> None:
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
