#!/usr/bin/env python3
"""Drives headless Chromium (Debian's `chromium`) through the dashboard as an analyst would:
opens /dashboard, is sent to the sign-in form, types the key and submits it, lands on the
dashboard, and reports what the browser rendered (as JSON on stdout) and a full-page screenshot.

    dashboard_browser_check.py BASE_URL KEY SCREENSHOT.png

The browser is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages separated by NUL bytes on file descriptors 3 and 4), so nothing but the standard
library is needed. The caller (tests/it/dashboard.rs) checks the report against the database.
"""

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def high(fd):
    """`fd` moved to a descriptor number of at least 10."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    def __init__(self, profile):
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            sys.exit("dashboard_browser_check: no chromium on PATH (scripts/test.sh installs Debian's chromium)")
        # Chrome reads commands from fd 3 and writes answers to fd 4. The child's ends are moved
        # above 10 first, so that putting them at 3 and 4 never overwrites one with the other
        # (os.pipe may hand out 3 and 4 themselves), and os.dup2 makes the copies inheritable.
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        to_chrome_r, from_chrome_w = high(to_chrome_r), high(from_chrome_w)

        def wire():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1400,1000",
             "--no-first-run", "--hide-scrollbars", "about:blank"],
            # Not close_fds: it would close 3 and 4 after `wire` put the pipes there.
            preexec_fn=wire, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the protocol pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method, session, timeout=60):
        deadline = time.time() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - closing is best effort; kill below
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# What the rendered page holds, read in the browser after layout.
READ_PAGE = r"""
JSON.stringify({
  path: location.pathname,
  title: document.title,
  cookie_visible_to_scripts: document.cookie,
  headline: (document.getElementById('headline') || {}).textContent || '',
  charts: [...document.querySelectorAll('svg.chart')].map(svg => ({
    title: svg.querySelector('text.chart-title').textContent,
    width: svg.getBoundingClientRect().width,
    height: svg.getBoundingClientRect().height,
    bars: [...svg.querySelectorAll('g.bar')].map(g => ({
      key: g.dataset.key,
      rate: Number(g.dataset.rate),
      count: Number(g.dataset.count),
      label: g.querySelectorAll('text')[1].textContent,
      bar_width: g.querySelector('rect').getBBox().width,
    })),
    points: svg.querySelectorAll('circle').length,
  })),
})
"""


def main():
    base, key, screenshot = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(profile)
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            browser.call("Page.enable", session=session)
            browser.call("Page.navigate", {"url": f"{base}/dashboard"}, session=session)
            browser.wait_for("Page.loadEventFired", session)
            landed = browser.call("Runtime.evaluate", {"expression": "location.pathname", "returnByValue": True},
                                  session=session)["result"]["value"]
            # Sign in as a person would: type the key into the form and submit it.
            browser.call("Runtime.evaluate", {"expression": (
                f"document.querySelector('input[name=key]').value = {json.dumps(key)};"
                "document.querySelector('form').submit();")}, session=session)
            browser.wait_for("Page.loadEventFired", session)
            page = json.loads(browser.call("Runtime.evaluate", {"expression": READ_PAGE, "returnByValue": True},
                                           session=session)["result"]["value"])
            page["first_landing"] = landed
            metrics = browser.call("Page.getLayoutMetrics", session=session)
            size = metrics["cssContentSize"]
            browser.call("Emulation.setDeviceMetricsOverride", {
                "width": 1400, "height": int(size["height"]) + 20, "deviceScaleFactor": 1, "mobile": False},
                session=session)
            shot = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                session=session)
            with open(screenshot, "wb") as out:
                out.write(base64.b64decode(shot["data"]))
            page["screenshot_bytes"] = os.path.getsize(screenshot)
        finally:
            browser.close()
    print(json.dumps(page))


if __name__ == "__main__":
    main()
