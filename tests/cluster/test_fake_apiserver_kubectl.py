"""The fake API server (tools/fake-apiserver) as a real client sees it: kubectl (v1.37, built by
scripts/k8s-components).

Go clients ask for gzip by default; a watch stream must still reach them event by event (defect 5 of the real
Kubernetes issue: a gzip-compressed chunked watch showed kubectl the first list and nothing after).
"""

import os
import re
import subprocess
import tempfile
import time

import pytest

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("TESSERA_BINARY_DIR", os.path.join(SOURCE, "build"))
KUBECTL = os.path.join(os.environ.get("TESSERA_K8S_BIN", os.path.join(SOURCE, "build", "k8s", "bin")), "kubectl")


@pytest.fixture
def fake():
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        p = subprocess.Popen([os.path.join(BUILD, "bin", "fake-apiserver"), "--write-kubeconfig", kubeconfig,
                              "--pods", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while not os.path.exists(kubeconfig) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(kubeconfig), "fake-apiserver wrote no kubeconfig"
        time.sleep(0.2)
        yield kubeconfig
        p.terminate()
        p.wait(10)


def kubectl(kubeconfig, *args, **kw):
    return subprocess.run([KUBECTL, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                          timeout=30, **kw)


def test_kubectl_watch_sees_every_event(fake):
    first = kubectl(fake, "get", "pods", "-o", "name")
    assert first.returncode == 0, first.stderr
    names = first.stdout.split()
    assert names, first.stdout
    watch = subprocess.Popen([KUBECTL, "--kubeconfig", fake, "get", "pods", "--watch", "-o",
                              "custom-columns=NAME:.metadata.name,LABEL:.metadata.labels.step", "--no-headers"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        for step in ("one", "two", "three"):
            r = kubectl(fake, "label", names[0], f"step={step}", "--overwrite")
            assert r.returncode == 0, r.stderr
        time.sleep(1.5)
    finally:
        watch.terminate()
        out, err = watch.communicate(timeout=10)
    assert re.search(r"\bthree\b", out), f"kubectl --watch saw only:\n{out}\n{err}"
