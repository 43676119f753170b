"""`postroom health`: asks the running service on this host for /healthz, exit 0 on 200.

It is the container image's HEALTHCHECK (there is no curl in the image), run every 30 s, so it
imports only the settings: `python -m postroom.health` starts in a fraction of the time the
whole command line takes to import.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from postroom import config


def probe(settings: config.Settings) -> int:
    """GET /healthz on the configured API address; 0 when it answers 200, else 1."""
    host, port = settings.api_listen
    # A wildcard listen address is reached on this host's loopback.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"postroom: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{url}: {status}")
    return 0 if status == 200 else 1


def main() -> None:
    try:
        settings = config.load()
    except config.SettingsError as exc:
        print(f"postroom: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(probe(settings))


if __name__ == "__main__":
    main()
