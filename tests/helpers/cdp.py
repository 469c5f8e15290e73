"""A tiny Chrome DevTools Protocol client for tests: headless chromium on 127.0.0.1, one page.

Playwright's browsers cannot be downloaded offline, so the tests drive Debian's chromium directly:
start it with --remote-debugging-port=0 (it writes the port it chose to DevToolsActivePort in its
profile folder), open the page target's websocket, send commands, and keep every event (console
messages, exceptions, network requests, dialogs) for the test to inspect. Host names resolve to
nothing, so a page that tried to reach the network would fail and show it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)


class Browser:
    def __init__(self, profile: Path, width: int = 1300, height: int = 1000) -> None:
        import websocket  # websocket-client, a dev dependency

        self.proc = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={profile}",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(profile)},  # its own temp folders go with the profile, not /tmp
        )
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        for _ in range(100):
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                break
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.events: list[dict[str, Any]] = []
        self._id = 0
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while time.monotonic() < deadline:
            for e in self.events[seen:]:
                if e.get("method") == method:
                    return e
            seen = len(self.events)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def open(self, url: str, timeout: float = 60) -> None:
        """Navigate to ``url`` and return once its document has loaded (its scripts ran).

        A load event alone is not that: the page being left may have begun a reload of its own (a live
        report reloads itself every second) whose event arrives after the navigation was asked for."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout)
        loaded = f"document.readyState === 'complete' && location.href === new URL({json.dumps(url)}).href"
        deadline = time.monotonic() + timeout
        while not self.js(loaded):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load within {timeout:g} s")
            time.sleep(0.05)

    def js(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **extra: Any) -> None:
        self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen since the page opened."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(str(p.get("args"))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text"))[:500])
            elif m == "Page.javascriptDialogOpening":
                out.append(f"dialog opened: {p.get('message')}")
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # never opened, or already gone
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
