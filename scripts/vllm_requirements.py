"""Print an installed vLLM distribution's requirements, one per line, less the named ones.

    python scripts/vllm_requirements.py DIST [SKIP ...]

Used by scripts/setup-vllm.sh and scripts/setup-vllm033.sh to install a vLLM wheel with
``--no-deps`` and then what it needs on a machine without a GPU: requirements of extras
and of other platforms are dropped (markers evaluated here), as are the SKIP names
(compared normalised: case, ``-``/``_``/``.``) and every ``nvidia-*`` package.
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def main(dist: str, skip: list[str]) -> None:
    skipped = {canonicalize_name(name) for name in skip}
    for line in requires(dist) or []:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in skipped or name.startswith("nvidia-"):
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
