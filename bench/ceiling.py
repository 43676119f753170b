"""The ceiling for the API: a no-op Quart-Trio endpoint under hypercorn-trio, same load client.

`python bench/ceiling.py` starts a child process serving `POST /v1/emails/` that reads the
JSON body and answers 202 with a small JSON object (no auth, no validation, no storage), and
drives it with `bench/load.py` exactly as `bench/delivery.py` drives Postroom's send endpoint
(50 keep-alive connections, the same body). Postroom's accept rate divided by this figure is
the share of the framework's ceiling that Postroom keeps (target: at least 90%).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_throughput import REPO, _free_port
from bench.delivery import _body
from bench.peers import bench_parser
from bench.stats import median_run


def _serve(port: int) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio(__name__)

    @app.post("/v1/emails/")
    async def accept() -> tuple[dict[str, Any], int]:
        body = await request.get_json()
        return {"id": "00000000-0000-0000-0000-000000000000", "to": len(body["to"])}, 202

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    trio.run(serve, app, config)


def measure(runs: int = 3, seconds: float = 5.0) -> dict[str, Any]:
    """Median of `runs` load runs against the no-op endpoint: rate, p50_ms, p99_ms."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{port}/")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        results = []
        for run in range(runs):
            out = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "bench" / "load.py"),
                    "--url",
                    f"http://127.0.0.1:{port}/v1/emails/",
                    "--method",
                    "POST",
                    "--body",
                    json.dumps(_body("{n}")),
                    "--concurrency",
                    "50",
                    "--seconds",
                    str(seconds),
                    "--start",
                    str(run * 10**7),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            results.append(json.loads(out.stdout))
        return median_run(results)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve)
        return
    result = measure(args.runs, args.seconds)
    print(
        f"no-op Quart-Trio  {result['rate']:>7.0f} req/s  p50 {result['p50_ms']:.1f} ms"
        f"  p99 {result['p99_ms']:.1f} ms   (runs: {result['runs']})",
        flush=True,
    )


if __name__ == "__main__":
    main()
