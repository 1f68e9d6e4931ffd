"""The gateway image's health check: exit 0 when ``/healthz`` answers 200, else 1.

``$TOKENPACE_HEALTHCHECK_URL`` is the address [http://127.0.0.1:8080/healthz, the
port the manifests' configuration listens on]. Kubernetes uses its own probes (the
Deployment's, on the same path); this is for ``docker``/``podman run``.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

URL_ENV = "TOKENPACE_HEALTHCHECK_URL"
DEFAULT_URL = "http://127.0.0.1:8080/healthz"


def main() -> int:
    url = os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
