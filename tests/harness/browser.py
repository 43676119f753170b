"""A real browser for the console's tests: Debian's Chromium driven by Playwright for Python.

One Chromium per xdist worker (a session fixture), started from `/usr/bin/chromium` by
path: no browser is downloaded. Playwright's sync API must stay on the thread that started
it, so the browser lives on a thread of its own and a Trio test hands it steps (plain
functions of a page) to run there, while the service under test goes on serving on the
test's own loop. Each test gets fresh contexts (its own cookies).

Every tab records Content-Security-Policy violations (the console's pages send a policy
without 'unsafe-inline') and script errors; `Tab.close` fails the test on any of them.
The tests are skipped, saying why, when Chromium or Playwright is missing.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from postroom.service import RunningService, serve
from tests.harness.dns_server import DnsServer
from tests.harness.service import free_port, test_settings
from tests.harness.tls import TlsAuthority

CHROMIUM = os.environ.get("POSTROOM_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
STEP_TIMEOUT = 30.0  # seconds a test waits for one batch of browser steps
PASSWORD = "correct horse battery staple"

T = TypeVar("T")

try:
    from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
except ImportError:  # the suite says so and skips the browser tests
    sync_playwright = None  # type: ignore[assignment]


class BrowserThread:
    """Chromium on a thread of its own; `call` runs a function of the browser there."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[Browser], Any], Future[Any]] | None] = queue.Queue()
        self._started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name="chromium", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.result(timeout=60)

    def _run(self) -> None:
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                self._started.set_result(None)
                while (job := self._jobs.get()) is not None:
                    work, result = job
                    try:
                        result.set_result(work(browser))
                    except BaseException as exc:
                        result.set_exception(exc)
                browser.close()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)

    def call_blocking(self, work: Callable[[Browser], T]) -> T:
        result: Future[T] = Future()
        self._jobs.put((work, result))
        return result.result(timeout=STEP_TIMEOUT)

    async def call(self, work: Callable[[Browser], T]) -> T:
        """Run `work` on the browser's thread; the Trio loop keeps serving meanwhile."""
        return await trio.to_thread.run_sync(self.call_blocking, work)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)


@dataclass
class Tab:
    """One page in a context of its own, with what went wrong on it recorded."""

    browser: BrowserThread
    page: Page
    problems: list[str] = field(default_factory=list)

    async def do(self, steps: Callable[[Page], T]) -> T:
        """Run `steps` against the page, on the browser's thread."""
        return await self.browser.call(lambda _: steps(self.page))

    async def close(self) -> None:
        """Close the tab; fail if any page it showed broke its CSP or raised."""
        await self.browser.call(lambda _: self.page.context.close())
        assert self.problems == [], "\n".join(self.problems)


def _watch(page: Page, problems: list[str]) -> None:
    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            problems.append(f"CSP violation on {page.url}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"script error on {page.url}: {error}"))


@dataclass
class Browsing:
    """The session's browser, opening tabs for one test at a time."""

    browser: BrowserThread

    async def open(self, base_url: str, *, scripts: bool = True) -> Tab:
        """A fresh tab (no cookies) whose relative URLs start at `base_url`; with `scripts`
        off, a browser that runs no JavaScript."""
        problems: list[str] = []

        def open_page(browser: Browser) -> Page:
            context = browser.new_context(
                base_url=base_url,
                viewport={"width": 1280, "height": 900},
                java_script_enabled=scripts,
            )
            context.set_default_timeout(10_000)
            page = context.new_page()
            _watch(page, problems)
            return page

        return Tab(self.browser, await self.browser.call(open_page), problems)


@pytest.fixture(scope="session")
def chromium() -> Iterator[BrowserThread]:
    """One Chromium per test process (xdist worker), started at its first browser test."""
    if sync_playwright is None:
        pytest.skip("Playwright is not installed (pip install playwright): browser tests skipped")
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium): browser tests skipped")
    thread = BrowserThread()
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def browsing(chromium: BrowserThread) -> Browsing:
    return Browsing(chromium)


@pytest.fixture
async def console(
    nursery: trio.Nursery, database_url: str, tls_ca: TlsAuthority, dns_server: DnsServer
) -> AsyncIterator[RunningService]:
    """The service with its console on a port chosen first, so that its public URL (the one
    Origin its sessions accept) is the address the browser opens; new workspaces start in the
    sandbox (POSTROOM_SANDBOX=on), as with `scripts/serve --sandbox`."""
    port = free_port()
    settings = test_settings(
        database_url,
        dns_server,  # a DNS check in a test never reaches the system resolver
        api_listen=f"127.0.0.1:{port}",
        public_url=f"http://127.0.0.1:{port}",
        sandbox="on",
        extra_ca_file=str(tls_ca.ca_file),
    )
    running: RunningService = await nursery.start(serve, settings)
    try:
        yield running
    finally:
        running.stop()


def new_email() -> str:
    return f"admin-{secrets.token_hex(4)}@example.org"
