"""docs/install.md, run as written against the cluster tier's real control plane and kubelet.

Every shell block of the page is run line by line (continuations joined), in a scratch copy of the repository,
with the cluster's kubeconfig and the components built by scripts/k8s-components first on PATH: the plain
manifests from section 2 to Uninstall, then the Helm path. The few lines that cannot run here are listed in
SKIPPED with the reason; a line that fails, or a block the page gains that this test does not know, fails it,
so the page and the cluster cannot drift apart.
"""

import os
import shutil
import subprocess
import tempfile

import pytest

from cluster import Cluster

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("TESSERA_BINARY_DIR", os.path.join(SOURCE, "build"))

# Lines of install.md that cannot run on this machine, and why.
SKIPPED = {
    "scripts/setup && scripts/build": "builds the project (done by the test's own build)",
    "docker build": "no container engine here; the cluster's runtime (cri-fake) needs no image",
    "docker push": "no registry is reachable",
    "kubectl -n tessera-system logs deploy/tessera-scheduler": "cri-fake runs no process, so a container has no log",
    "scripts/k8s-components && scripts/build && ctest": "the test suite itself",
}

# Sections run in order for each path; any other section with a shell block must be named in SKIPPED_SECTIONS.
PLAIN = ["2. The node agent", "3. The webhook's certificate", "4. The scheduler (plain manifests)", "5. Check it",
         "Uninstall"]
HELM = ["4'. Everything with Helm"]
SKIPPED_SECTIONS = {"1. The image": "builds and pushes the image", "The manifests are tested": "runs the tests"}


def sections():
    """Section title -> list of command lines of its ```sh blocks."""
    out, title, block = {}, None, None
    with open(os.path.join(SOURCE, "docs", "install.md")) as f:
        for line in f:
            line = line.rstrip("\n")
            if block is None and line.startswith("#"):
                title = line.lstrip("#").strip()
            elif block is None and line.strip() == "```sh":
                block = []
            elif block is not None and line.strip() == "```":
                text = "\n".join(block).replace("\\\n", " ")
                out.setdefault(title, []).extend(l.strip() for l in text.split("\n") if l.strip())
                block = None
            elif block is not None:
                block.append(line)
    return out


@pytest.fixture(scope="module")
def c():
    with Cluster(SOURCE, BUILD) as cluster:
        yield cluster


def run_sections(c, titles, workdir):
    env = dict(os.environ, KUBECONFIG=c.path("admin.kubeconfig"),
               PATH=os.pathsep.join([c.k8s_bin, os.path.join(BUILD, "bin"), os.path.join(SOURCE, "tools"),
                                     os.environ["PATH"]]))
    all_sections = sections()
    for title in titles:
        assert title in all_sections, f"install.md has no shell block under '{title}' any more"
        for line in all_sections[title]:
            if any(line.startswith(prefix) for prefix in SKIPPED):
                continue
            r = subprocess.run(["bash", "-c", line], cwd=workdir, env=env, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, f"install.md, {title}: `{line}` failed ({r.returncode}):\n{r.stdout}{r.stderr}"


def scratch_copy(tmp):
    for d in ("deploy", "docs"):
        shutil.copytree(os.path.join(SOURCE, d), os.path.join(tmp, d), ignore=shutil.ignore_patterns("tls"))
    return tmp


def test_every_shell_block_is_run_or_skipped_for_a_reason():
    known = set(PLAIN) | set(HELM) | set(SKIPPED_SECTIONS)
    unknown = [t for t in sections() if t not in known]
    assert not unknown, f"install.md has shell blocks this test does not run: {unknown}"


def test_plain_manifests_then_helm_as_written(c):
    with tempfile.TemporaryDirectory() as tmp:
        run_sections(c, PLAIN, scratch_copy(tmp))
    # The Uninstall section deletes the namespace; the Helm path creates it again.
    c.wait_for(lambda: c.kubectl("get", "namespace", "tessera-system", check=False).returncode != 0,
               "the namespace to be deleted", 120)
    with tempfile.TemporaryDirectory() as tmp:
        run_sections(c, HELM, scratch_copy(tmp))
        r = c.kubectl("get", "daemonset,deployment", "-n", "tessera-system", "-o", "name")
        names = set(r.stdout.split())
        assert {"daemonset.apps/tessera-node", "deployment.apps/tessera-scheduler",
                "deployment.apps/tessera-kube-scheduler"} <= names, names
