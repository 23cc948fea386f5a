"""chromium -- one page kept open in headless Chromium, read while it runs.

Goal: let a test (tests/integration/40-console.py) or a benchmark
(bench/console_load.py) see what the web console draws, in real time, from
Python's standard library alone.

Method: Debian's chromium with --remote-debugging-pipe: commands go to the
browser's fd 3 and answers come back on its fd 4, each a JSON text ended
by NUL (the DevTools protocol); the page runs in a profile of its own,
removed at close(), so nothing is cached between pages.
"""
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                  "--disable-dev-shm-usage", "--disable-extensions"]


class LivePage:
    """Chromium on start_url (navigate() goes elsewhere, once attached)."""

    call_timeout = 20  # seconds for an answer to a command

    def __init__(self, start_url, profile_prefix="quay-chromium-"):
        self.profile = tempfile.mkdtemp(prefix=profile_prefix)
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()

        def fds():  # in the child: the pipe ends where Chromium wants them
            # Out of the way first (either may be 3 or 4 already), then
            # inheritable: os.pipe()'s ends are close-on-exec, and a dup2
            # onto itself would keep that.
            r, w = os.dup(cmd_r), os.dup(res_w)
            os.dup2(r, 3)
            os.dup2(w, 4)
        self.proc = subprocess.Popen(
            [CHROMIUM] + CHROMIUM_FLAGS + ["--user-data-dir=" + self.profile,
                                           "--remote-debugging-pipe", start_url],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds)
        os.close(cmd_r)
        os.close(res_w)
        self.next_id = 0
        self.buffer = b""
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": page["targetId"], "flatten": True})["sessionId"]

    def navigate(self, url):
        self.call("Page.enable", session=self.session)
        self.call("Page.navigate", {"url": url}, self.session)

    def call(self, method, params=None, session=None, timeout=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.call_timeout)
        while True:
            while b"\0" in self.buffer:
                text, self.buffer = self.buffer.split(b"\0", 1)
                answer = json.loads(text)
                if answer.get("id") == self.next_id:
                    if "error" in answer:
                        raise AssertionError("%s: %s" % (method, answer["error"]))
                    return answer["result"]
            left = deadline - time.monotonic()
            assert left > 0, "no answer from chromium to %s" % method
            if select.select([self.res_r], [], [], left)[0]:
                chunk = os.read(self.res_r, 1 << 20)
                assert chunk, "chromium closed its pipe"
                self.buffer += chunk

    def evaluate(self, expression):
        """The expression's value in the page (an exception there fails)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True}, self.session)
        if "exceptionDetails" in result:
            raise AssertionError("%s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def close(self):
        os.close(self.cmd_w)
        self.proc.kill()
        self.proc.wait(10)
        os.close(self.res_r)
        shutil.rmtree(self.profile, ignore_errors=True)
