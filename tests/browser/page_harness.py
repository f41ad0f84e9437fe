"""A standalone tessera-scheduler with its operators' page on, pods placed through its extender verbs, and the
page opened in a headless Chromium driven by WebDriver (Debian's chromium, chromium-driver, python3-selenium).

Used by tests/browser/page_browser_test.py (what a person sees on the page) and bench/page_bench.py (the data
endpoint's time and size and the page's render time at 5,000 nodes x 8 GPUs).
"""
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def fail(message):
    print(f"FAILED: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def browser_missing():
    """Why no browser can run here, or None. scripts/setup installs all three."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (scripts/setup installs chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "python3-selenium is missing (scripts/setup installs it)"
    return None


def pod(ns, name, uid, cores, memory, annotations=None):
    limits = {"tessera.dev/gpu-cores": str(cores), "tessera.dev/gpu-memory": str(memory)}
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


class Scheduler:
    """tessera-scheduler --cluster-file FILE with the page on; both on free loopback ports."""

    def __init__(self, binary, cluster, extra=()):
        self.tmp = tempfile.mkdtemp(prefix="tessera-page-")
        path = os.path.join(self.tmp, "cluster.json")
        with open(path, "w") as f:
            json.dump(cluster, f)
        self.proc = subprocess.Popen(
            [binary, "--cluster-file", path, "--listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # printed once both listeners serve
        m = re.search(r"extender at http://127\.0\.0\.1:(\d+)/.*page at http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            self.close()
            fail(f"tessera-scheduler did not start with its page: {line!r} {self.proc.stderr.read()!r}")
        self.port, self.page_port = int(m.group(1)), int(m.group(2))
        self.page_url = f"http://127.0.0.1:{self.page_port}/"
        self._conns = {}

    def _conn(self, port):
        c = self._conns.get(port)
        if c is None:
            c = self._conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        return c

    def request(self, port, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):
            c = self._conn(port)
            try:
                c.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError):
                c.close()
                self._conns.pop(port, None)
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def verb(self, name, body):
        status, out = self.request(self.port, "POST", f"/scheduler/{name}", body)
        if status != 200:
            fail(f"{name} answered {status}: {out[:300]!r}")
        return json.loads(out)

    def filter(self, p, nodes):
        return self.verb("filter", {"Pod": p, "NodeNames": nodes})

    def place(self, p, node):
        """Filter over `node` alone, then bind there, as kube-scheduler would once it chose the node."""
        f = self.filter(p, [node])
        if f["NodeNames"] != [node]:
            fail(f"{p['metadata']['name']} does not fit {node}: {f}")
        m = p["metadata"]
        b = self.verb("bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                               "Node": node})
        if b.get("Error"):
            fail(f"bind {m['name']} to {node}: {b['Error']}")

    def get(self, path, port=None):
        status, out = self.request(port or self.page_port, "GET", path)
        if status != 200:
            fail(f"GET {path} answered {status}")
        return out

    def close(self):
        for c in self._conns.values():
            c.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Browser:
    """Headless Chromium through chromedriver (WebDriver)."""

    def __init__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        self.profile = tempfile.mkdtemp(prefix="tessera-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--no-proxy-server", f"--user-data-dir={self.profile}", "--window-size=1400,1000"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_script_timeout(120)
        self.driver.set_page_load_timeout(120)

    def wait(self, what, check, timeout=90):
        """Waits for `check()` to be truthy; generous: only a broken page misses it."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                v = check()
                if v:
                    return v
            except Exception as e:  # an element not there yet
                last = e
            time.sleep(0.2)
        fail(f"timed out waiting for {what}" + (f" ({last})" if last else ""))

    def close(self):
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
