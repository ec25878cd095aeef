"""The documentation site as a reader's browser shows it: every page of a built site, loaded in
headless Chromium (Debian's `chromium` package) at 1280 x 900 over the DevTools protocol.

    python -m tests.docs_browser SITE_DIR [--screenshots DIR]     (`make check-docs`)

Fails (exit 1, one line per problem) when a page has no title or throws a script error, when a
page asks anything of a host other than the local server (the site must work offline: Mermaid
is bundled), when a `mermaid` block is not drawn as an SVG, when a decision table (a code block
holding `rank  chunk`) needs a horizontal scroll bar, or when search finds nothing for a word
every page has. The screenshots are for a person to look at.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import http.server
import itertools
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

WIDTH, HEIGHT = 1280, 900
CHROMIUM_FLAGS = [  # no first-run, sync, update or background traffic of its own
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", "--remote-debugging-port=0",
]
PAGE_STATE = """(() => {
  // Material scrolls a code block in its <code>, a table in its scroll wrapper.
  const wide = element => element.scrollWidth > element.clientWidth + 1;
  const decision = [...document.querySelectorAll('pre > code')]
    .filter(code => code.textContent.includes('rank  chunk'));
  return {
    title: document.querySelector('.md-content h1')?.textContent ?? null,
    // Markdown an extension should have rendered: tabs, collapsible blocks, fences.
    raw: (document.querySelector('.md-content')?.innerText ?? '').split('\\n')
      .filter(line => /^\\s*(=== "|\\?\\?\\? \\w|```)/.test(line)).slice(0, 3),
    overflowing: decision.filter(wide).map(code => code.textContent.split('\\n')[0].slice(0, 60)),
    decisionTables: decision.length,
    tablesOverflowing: [...document.querySelectorAll('.md-typeset__scrollwrap')]
      .filter(wide).map(wrap => wrap.textContent.trim().slice(0, 60)),
    codeOverflowing: [...document.querySelectorAll('pre, pre > code')]
      .filter(wide).map(code => code.textContent.trim().slice(0, 60)),
  };
})()"""
SEARCH = """(async () => {
  const input = document.querySelector('.md-search__input');
  input.focus();
  input.value = 'policy';
  input.dispatchEvent(new Event('input', {bubbles: true}));
  input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true, key: 'y'}));
  for (let i = 0; i < 100; i++) {
    const found = document.querySelectorAll('.md-search-result__item').length;
    if (found) return found;
    await new Promise(done => setTimeout(done, 100));
  }
  return 0;
})()"""


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`node` and every node below it, shadow roots included."""
    yield node
    for child in [*node.get("children", []), *node.get("shadowRoots", [])]:
        yield from nodes(child)


def is_diagram(node: dict[str, Any]) -> bool:
    attributes = node.get("attributes", [])
    pairs = dict(zip(attributes[::2], attributes[1::2], strict=True))
    return "mermaid" in pairs.get("class", "").split()


def pages(site: Path) -> list[str]:
    """Every page of the site, as a path under its root ("" is the home page)."""
    return sorted(str(index.parent.relative_to(site)).removeprefix(".") for index in
                  site.rglob("index.html") if not index.parent.name.startswith(("assets", "search")))


@contextlib.contextmanager
def serving(site: Path) -> Iterator[str]:
    """The site over HTTP on a free loopback port (search does not work from files)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def chromium() -> Iterator[str]:
    """A headless Chromium with a fresh profile; yields its DevTools address."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("check-docs: no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="check-docs-", ignore_cleanup_errors=True) as profile:
        process = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                    "about:blank"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            for _ in range(300):
                if port_file.is_file() and port_file.read_text().strip():
                    break
                if process.poll() is not None:
                    raise SystemExit(f"check-docs: chromium exited ({process.returncode})")
                threading.Event().wait(0.1)
            yield f"127.0.0.1:{port_file.read_text().split()[0]}"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Page:
    """One tab over the DevTools protocol: commands, and the events that came with them."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        await self.socket.send_json({"id": number, "method": method, "params": params})
        while True:
            message = await self.socket.receive_json(timeout=60)
            if message.get("id") == number:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result
            self.events.append(message)

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                                 returnByValue=True)
        return answer["result"].get("value")

    async def open(self, url: str, diagrams: int) -> None:
        """Navigate and wait until the page has loaded and drawn its `diagrams`."""
        self.events.clear()
        await self.call("Page.navigate", url=url)
        for _ in range(300):
            if any(event.get("method") == "Page.loadEventFired" for event in self.events):
                break
            await self.call("Runtime.evaluate", expression="0")  # collects events meanwhile
            await asyncio.sleep(0.05)
        for _ in range(100):  # Mermaid draws after the load event
            if await self.svgs() >= diagrams:
                break
            await asyncio.sleep(0.1)

    async def svgs(self) -> int:
        """The diagrams drawn: Material draws each into a closed shadow root of a
        div.mermaid, which only the DevTools protocol can look into."""
        document = (await self.call("DOM.getDocument", depth=-1, pierce=True))["root"]
        return sum(1 for node in nodes(document) if is_diagram(node)
                   and any(n["nodeName"].lower() == "svg" for root in node.get("shadowRoots", [])
                           for n in nodes(root)))


@contextlib.asynccontextmanager
async def tab(devtools: str) -> AsyncIterator[Page]:
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://{devtools}/json/new?about:blank") as response:
            target = await response.json(content_type=None)
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            page = Page(socket)
            await page.call("Page.enable")
            await page.call("Network.enable")
            await page.call("Runtime.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                            deviceScaleFactor=1, mobile=False)
            yield page


async def check(site: Path, screenshots: Path | None) -> list[str]:
    problems: list[str] = []
    with serving(site) as root, chromium() as devtools:
        async with tab(devtools) as page:
            for path in pages(site):
                url = root + (f"{path}/" if path else "")
                diagrams = (site / path / "index.html").read_text("utf-8").count(
                    '<pre class="mermaid">')  # as the site's HTML has them, before any script
                await page.open(url, diagrams)
                state = {**await page.evaluate(PAGE_STATE), "svgs": await page.svgs(),
                         "mermaid": diagrams}
                name = path or "home"
                problems += [f"{name}: {problem}" for problem in page_problems(page, state, root)]
                if screenshots is not None:
                    size = (await page.call("Page.getLayoutMetrics"))["cssContentSize"]
                    clip = {"x": 0, "y": 0, "width": WIDTH, "scale": 1,
                            "height": min(size["height"], 4 * HEIGHT)}
                    shot = await page.call("Page.captureScreenshot", format="png", clip=clip,
                                           captureBeyondViewport=True)
                    (screenshots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
                print(f"check-docs: {name}: {state['svgs']} diagrams, "
                      f"{state['decisionTables']} decision tables")
            await page.open(root, 0)
            if not await page.evaluate(SEARCH):
                problems.append("search: no result for 'policy'")
    return problems


def page_problems(page: Page, state: dict[str, Any], root: str) -> list[str]:
    found = []
    if not state["title"]:
        found.append("no title: the page did not render")
    found += [f"markdown left unrendered: {line.strip()!r}" for line in state["raw"]]
    if state["svgs"] < state["mermaid"]:
        found.append(f"{state['mermaid'] - state['svgs']} mermaid diagrams not drawn as SVG")
    found += [f"decision table wider than the column at {WIDTH} px: {first!r}"
              for first in state["overflowing"]]
    found += [f"table wider than the column at {WIDTH} px: {first!r}"
              for first in state["tablesOverflowing"]]
    found += [f"code block wider than the column at {WIDTH} px: {first!r}"
              for first in state["codeOverflowing"]]
    for event in page.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith((root, "data:", "blob:", "about:")):
                found.append(f"asks the network for {url}: the site must work offline")
        elif method == "Runtime.exceptionThrown":
            found.append(f"script error: {params['exceptionDetails'].get('text')}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.docs_browser", description=__doc__)
    parser.add_argument("site", type=Path, help="a built site (make docs: site/)")
    parser.add_argument("--screenshots", type=Path, help="write one PNG per page here")
    args = parser.parse_args()
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    problems = asyncio.run(check(args.site, args.screenshots))
    for problem in problems:
        print(f"check-docs: {problem}", file=sys.stderr)
    if not problems:
        print(f"check-docs: {len(pages(args.site))} pages render offline, diagrams drawn, "
              f"decision tables fit at {WIDTH} px, search answers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
