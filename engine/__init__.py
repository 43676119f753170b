"""Postroom's domain rules and long-lived Trio actors.

The engine knows nothing of HTTP or SMTP servers: front doors call its functions and render
what they return. It depends only on `storage`.
"""

from dns import (
    _features as dnspython_features,  # not `import dns`: it would hide engine.platform.dns
)

# Postroom asks DNS servers over UDP and TCP only. Left on, DNS over HTTPS makes dnspython
# import httpx2 and h2 whenever they are installed (the MCP SDK brings them): 0.1-0.2 s of
# CPU at every start of every process, a `postroom` command's and each worker's.
dnspython_features.force("doh", False)
