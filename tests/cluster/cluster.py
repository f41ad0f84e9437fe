"""A real Kubernetes control plane and node on this machine, for Tessera's end-to-end tier (docs/k8s-harness.md).

Everything is the real program built from its own sources by scripts/k8s-components, except the container
runtime: etcd, kube-apiserver (TLS, RBAC, admission webhooks on), kube-controller-manager, kube-scheduler (the
cluster's default one, and Tessera's second one configured with deploy/'s own KubeSchedulerConfiguration and
extender), a real kubelet as one node (cgroup v1 allowed by its own `failCgroupV1: false`), tessera-scheduler
(extender and admission webhook, registered through deploy/'s own webhook configurations) and tessera-node (the
kubelet's device plugin, on fake GPUs). The kubelet's runtime is cri-fake: Kubernetes' own fake CRI
(k8s.io/cri-client/pkg/fake), which runs no process but records what the kubelet asked it to create.

What differs from a cluster, and why, is listed in docs/k8s-harness.md: host paths are under a work directory,
webhook and extender addresses are on loopback instead of Service names (no kube-proxy, no cluster DNS).

    with Cluster(source_dir, build_dir) as c:
        c.apply(POD_YAML)
        c.wait_for(lambda: c.pod("default", "p")["status"]["phase"] == "Running", "the pod to run")
"""

import base64
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import yaml

NODE = "gpu-node-0"
FAKE_GPUS = "examples/fake-gpus/two-socket-8gpu.yaml"
SLOTS_PER_GPU = 10
RENAMED_HAMI_MEMORY_PERCENT = "example.com/vgpu-memory-percentage"
# The kubelet's root directory, as on a node: the DaemonSet's host paths (/var/lib/kubelet/device-plugins,
# /var/lib/kubelet/pod-resources) must exist as shipped, and the kubelet serves its device-plugin registration
# socket at /var/lib/kubelet/device-plugins/kubelet.sock whatever its --root-dir (pluginapi.KubeletSocket). So one
# harness per machine, under a lock, and never on a machine whose /var/lib/kubelet belongs to a real kubelet.
KUBELET_ROOT = os.environ.get("TESSERA_HARNESS_KUBELET_ROOT", "/var/lib/kubelet")
MARKER = ".tessera-harness"


def _die_with_parent():
    """In the child before exec: SIGKILL when the harness dies, however it dies, so that no kubelet outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def unmount_under(root):
    """Lazily unmounts every mount point at or below root, deepest first."""
    root = os.path.realpath(root)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_connections(server, stop, serve):
    """Accepts connections on `server` (a listening socket with a timeout) until `stop` is set, each served by
    `serve(conn)` on a thread of its own: the loop of the harness's TCP stand-ins (ServiceProxy, chaos.py's
    ApiFaultProxy)."""
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except (socket.timeout, OSError):
            continue
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


class HarnessError(Exception):
    pass


class ServiceProxy:
    """Stands in for a Service with readiness-gated endpoints (kube-proxy): forwards each TCP connection on a
    loopback port to the first backend whose readiness URL answers 200, as the Service of tessera-scheduler sends
    kube-scheduler's and the API server's calls to the leader alone (its /readyz is 200 only there)."""

    def __init__(self, name):
        self.name = name
        self.port = free_port()
        self.backends = []  # (port, readiness url)
        self.ready_port = None
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        threading.Thread(target=self._probe, daemon=True).start()
        threading.Thread(target=serve_connections, args=(self._server, self._stop, self._serve), daemon=True).start()

    def _probe(self):
        import urllib.request
        while not self._stop.is_set():
            ready = None
            for port, url in list(self.backends):
                try:
                    with urllib.request.urlopen(url, timeout=1) as r:
                        if r.status == 200:
                            ready = port
                            break
                except Exception:
                    pass
            self.ready_port = ready
            self._stop.wait(0.5)

    def _serve(self, conn):
        port = self.ready_port
        if port is None:
            conn.close()  # no ready endpoint: the connection is refused, as with an empty Service
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            conn.close()
            return
        # The timeout was for connecting. kube-proxy closes no idle connection (conntrack keeps an established
        # one for days): with it left on, every connection idle for 5 s was closed here, and the API server,
        # writing its next webhook call onto it at that moment, failed the call with EOF.
        upstream.settimeout(None)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self):
        self._stop.set()
        self._server.close()


class Process:
    """A component: a child process with its log in the work directory."""

    def __init__(self, name, argv, log_dir, env=None):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(log_dir, name + ".log")
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        log.write(("\n==== start: " + " ".join(self.argv) + "\n").encode())
        log.flush()
        # Each component in an empty directory of its own: a component that resolves a relative path (the
        # kubelet removing a container log the runtime reported without a path) touches nothing else.
        cwd = os.path.join(os.path.dirname(self.log_path), "..", "cwd", self.name)
        os.makedirs(cwd, exist_ok=True)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True, cwd=cwd, preexec_fn=_die_with_parent)
        log.close()
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if not self.alive():
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def since_start(self):
        """The log of the running instance: from its last start marker on."""
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return text[text.rfind("\n==== start: "):]

    def tail(self, lines=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def run(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def resolve_under(root, path):
    """`path` as a process chrooted at `root` sees it, as a path on this machine, where `root` shows this
    machine's / (an overlay of it): each symbolic link met on the way (/var/run -> /run) is read from / and
    resolved inside `root`; following it from this machine would make the mount point outside. Missing parts
    are kept."""
    parts = [p for p in path.split("/") if p]
    out = []
    for hops in range(64):
        if not parts:
            return os.path.join(root, *out)
        part = parts.pop(0)
        if part == "..":
            out = out[:-1]
            continue
        here = os.path.join("/", *out, part)
        if os.path.islink(here):
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                out = []
            continue
        out.append(part)
    raise HarnessError(f"too many symbolic links under {root} in {path}")


class ContainerProcess:
    """A process run the way a container runtime would run the container the kubelet asked cri-fake to create:
    cri-fake runs nothing, so the harness plays the runtime for the tests that need a live tenant. From the
    CreateContainer record: its own mount namespace with a root of its own (this machine's / under a throwaway
    overlay, so that mount points can be made without touching the machine), every mount the kubelet asked for
    bound at its container path (read-only where asked), the record's environment and nothing else, and the
    process in a cgroup of the pod (kubepods/besteffort/pod<uid>/<container id>, cgroupfs layout), which is how
    tessera-node tells whose a registering process is. Extra environment stands in for what the NVIDIA container
    toolkit would add (the driver library, the visible GPUs).

    Lines the process prints are kept (`lines`); its stderr goes to a log in the work directory. Closing its
    stdin (`stop`) is the tenant's signal to end."""

    def __init__(self, cluster, record, argv, extra_env=None, extra_mounts=()):
        self.cluster, self.record = cluster, record
        name = f"{record['pod']}-{record['container']}-{record['attempt']}"
        self.dir = cluster.path("runtime", name)
        os.makedirs(self.dir, exist_ok=True)
        self.cgroup = self._make_cgroup(record)
        root = os.path.join(self.dir, "root")
        binds = [(m["host"], m["container"], m["readonly"]) for m in record["mounts"]]
        binds += [(h, ctr, ro) for h, ctr, ro in extra_mounts]
        # This machine's directories the tenant's programs live in, in case they are on another file system
        # than / (the overlay shows / alone).
        binds += [(d, d, True) for d in sorted({cluster.src, cluster.build})]
        script = ["set -e", f"echo $$ > {self.cgroup}/cgroup.procs",
                  f"mount -t tmpfs tmpfs {self.dir}/fs", f"mkdir -p {self.dir}/fs/upper {self.dir}/fs/work {root}",
                  f"mount -t overlay overlay -o lowerdir=/,upperdir={self.dir}/fs/upper,workdir={self.dir}/fs/work "
                  f"{root}"]
        for d in ("proc", "dev", "sys"):
            script.append(f"mount --rbind /{d} {root}/{d}")
        for host, ctr, ro in binds:
            target = resolve_under(root, ctr)
            make = f"mkdir -p '{target}'" if os.path.isdir(host) else \
                f"mkdir -p '{os.path.dirname(target)}' && touch '{target}'"
            script.append(make)
            script.append(f"mount --bind '{host}' '{target}'")
            if ro:
                script.append(f"mount -o remount,bind,ro '{target}'")
        env = dict(record["env"])
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(extra_env or {})
        script.append("exec chroot " + root + " /usr/bin/env -i " +
                      " ".join(f"'{k}={v}'" for k, v in sorted(env.items())) + " " +
                      " ".join(f"'{a}'" for a in argv))
        os.makedirs(os.path.join(self.dir, "fs"), exist_ok=True)
        self.stderr_path = os.path.join(self.dir, "stderr.log")
        self.lines = []
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                          "\n".join(script)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         preexec_fn=_die_with_parent)
        threading.Thread(target=self._read, daemon=True).start()

    @staticmethod
    def _make_cgroup(record):
        for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):  # cgroup v1's pids hierarchy, or v2
            if os.path.exists(os.path.join(base, "cgroup.procs")):
                path = os.path.join(base, "kubepods", "besteffort", f"pod{record['podUID']}", record["id"])
                os.makedirs(path, exist_ok=True)
                return path
        raise HarnessError("no cgroup hierarchy to put the container's process in (/sys/fs/cgroup/pids or v2)")

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout=30):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # The pod's cgroup directories, leaf first, once empty.
        path = self.cgroup
        while os.path.basename(path) != "kubepods":
            with contextlib.suppress(OSError):
                os.rmdir(path)
            path = os.path.dirname(path)
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return self.proc.returncode


class Cluster:
    def __init__(self, source_dir, build_dir, k8s_bin=None, keep=False, scheduler_args=(), service_proxy=True,
                 dra_gpus=(), apiserver_args=(), dra_fallback_after=None, fake_gpus=FAKE_GPUS, api_front=None,
                 node_args=()):
        self.src = os.path.abspath(source_dir)
        self.build = os.path.abspath(build_dir)
        self.k8s_bin = os.path.abspath(k8s_bin or os.environ.get("TESSERA_K8S_BIN")
                                       or os.path.join(self.src, "build", "k8s", "bin"))
        self.keep = keep or os.environ.get("TESSERA_HARNESS_KEEP") == "1"
        self.work = tempfile.mkdtemp(prefix="tessera-k8s-", dir=os.environ.get("TMPDIR", "/tmp"))
        self.logs = os.path.join(self.work, "logs")
        os.makedirs(self.logs)
        self.procs = {}
        self.ports = {}
        self.scheduler_args = list(scheduler_args)
        # tessera-node's --dra-fallback-after (seconds), where a test cannot wait the shipped minute.
        self.dra_fallback_after = dra_fallback_after
        # More tessera-node flags, after the DaemonSet's (where a test cannot wait a shipped default).
        self.node_args = list(node_args)
        # False: one tessera-scheduler replica, called directly (the scale benchmark, where the stand-in's Python
        # forwarding would be what is measured).
        self.service_proxy = service_proxy
        # GPU indices tessera-node gives to its DRA driver (--dra-gpus); their device-plugin slots are unhealthy.
        self.dra_gpus = list(dra_gpus)
        # The fake-GPU file tessera-node reads (--fake-gpus), relative to the source directory: the node's GPUs
        # and their `nvidia-smi topo -m`. A test may change it (and dra_gpus) and restart the agent.
        self.fake_gpus = fake_gpus
        # More kube-apiserver flags (test_kueue.py: an audit log, where the order of the webhook calls shows).
        self.apiserver_args = list(apiserver_args)
        # Called with the cluster once kube-apiserver is up; returns the port tessera-scheduler and tessera-node
        # reach the API at instead of kube-apiserver's own (a fault proxy in front of it: tests/cluster/chaos.py).
        # Their kubeconfigs say https://127.0.0.1:<port>; the proxy serves the API server's certificate.
        self.api_front = api_front
        for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
                  "cri-fake"):
            if not os.access(os.path.join(self.k8s_bin, b), os.X_OK):
                raise HarnessError(f"{b} is not in {self.k8s_bin}: run scripts/k8s-components first")

    # ---- paths and helpers ----
    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def bin(self, name):
        return os.path.join(self.k8s_bin, name)

    def tessera(self, name):
        return os.path.join(self.build, "bin", name)

    def kubectl(self, *args, input=None, check=True, kubeconfig=None, timeout=60):
        argv = [self.bin("kubectl"), "--kubeconfig", kubeconfig or self.path("admin.kubeconfig"), *args]
        r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def apply(self, text, **kw):
        return self.kubectl("apply", "-f", "-", input=text, **kw)

    def get(self, kind, name=None, ns=None):
        args = ["get", kind] + ([name] if name else []) + (["-n", ns] if ns else []) + ["-o", "json"]
        return json.loads(self.kubectl(*args).stdout)

    def pod(self, ns, name):
        r = self.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def wait_for(self, predicate, what, timeout=60, interval=0.25):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except (HarnessError, KeyError, TypeError, IndexError) as e:
                last = e
            time.sleep(interval)
        why = f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last})" if last else "")
        # The reason comes first and again last: CI shows the tail of a failure, after the components' logs.
        raise HarnessError(f"{why}\n{self.diagnostics()}\n=== {why}")

    def diagnostics(self):
        out = []
        for name, p in self.procs.items():
            state = "running" if p.alive() else f"exited {p.proc.returncode if p.proc else '-'}"
            out.append(f"--- {name} ({state}), last lines of {p.log_path}:\n{p.tail(15)}")
        # What the cluster holds: the pods not running and the latest events say where a pod is stuck.
        for title, args in (("pods", ("get", "pods", "-A", "-o", "wide")),
                            ("events, newest last", ("get", "events", "-A", "--sort-by=.lastTimestamp"))):
            try:
                r = self.kubectl(*args, check=False, timeout=20)
                lines = r.stdout.splitlines()
                out.append(f"--- kubectl {' '.join(args)} ({len(lines)} lines, last 25):\n" + "\n".join(lines[-25:]))
            except Exception as e:  # diagnostics never hide the failure they describe
                out.append(f"--- kubectl {' '.join(args)}: {e}")
        # What the scheduler and the agent wrote on each pod: a share that did not follow shows here.
        try:
            r = self.kubectl("get", "pods", "-A", "-o", "json", check=False, timeout=20)
            for p in json.loads(r.stdout).get("items", [])[-25:]:
                meta = p["metadata"]
                notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("tessera.dev/")}
                out.append(f"--- pod {meta['namespace']}/{meta['name']}: {json.dumps(notes, sort_keys=True)}")
        except Exception as e:  # diagnostics never hide the failure they describe
            out.append(f"--- pods' annotations: {e}")
        return "\n".join(out)

    def container_records(self):
        """What the kubelet asked the runtime to create, one dict per CreateContainer (cri-fake's record)."""
        try:
            with open(self.path("containers.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    # ---- PKI ----
    def _openssl(self, *args):
        run(["openssl", *args], cwd=self.path("pki"))

    def _make_pki(self):
        os.makedirs(self.path("pki"))
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                      "-days", "2", "-subj", "/CN=tessera-harness-ca")

        def cert(name, subj, san=None, client=False, key=("rsa:2048",)):
            self._openssl("req", "-newkey", *key, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                          "-subj", subj)
            ext = [f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
            if san:
                ext.append("subjectAltName=" + san)
            with open(self.path("pki", f"{name}.ext"), "w") as f:
                f.write("\n".join(ext) + "\n")
            self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                          "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")

        cert("apiserver", "/CN=kube-apiserver",
             "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc,IP:10.0.0.1")
        cert("admin", "/O=system:masters/CN=harness-admin", client=True)
        # ECDSA, as deploy/scheduler/gen-webhook-tls.sh makes it.
        cert("webhook", "/CN=tessera-scheduler-webhook", "IP:127.0.0.1,DNS:localhost",
             key=("ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"))
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def kubeconfig(self, name, user, port=None):
        path = self.path(name + ".kubeconfig")
        doc = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "harness", "cluster": {
                "server": f"https://127.0.0.1:{port or self.ports['apiserver']}",
                "certificate-authority": self.path("pki", "ca.crt")}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": name}}],
            "current-context": "harness",
        }
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
        return path

    def token_kubeconfig(self, ns, sa, port=None):
        """A kubeconfig with a token of the service account, so the component has exactly deploy/'s RBAC; `port`:
        another address of the API than kube-apiserver's own (api_front)."""
        token = self.kubectl("create", "token", sa, "-n", ns, "--duration", "6h").stdout.strip()
        return self.kubeconfig(f"{ns}-{sa}", {"token": token}, port)

    # ---- components ----
    def kill(self, name):
        """SIGKILLs a component (tests/cluster/chaos.py); `restart` starts it again with the same argv."""
        self.procs[name].stop(signal.SIGKILL)

    def restart(self, name):
        """Starts a stopped component again, with the command line and environment it was first started with."""
        p = self.procs[name]
        if not p.alive():
            p.start()
        return p

    def pause(self, name):
        """SIGSTOP: the component keeps its sockets and state but answers nothing until `resume` (SIGCONT)."""
        p = self.procs[name]
        if p.alive():
            os.kill(p.proc.pid, signal.SIGSTOP)

    def resume(self, name):
        p = self.procs[name]
        if p.alive():
            os.kill(p.proc.pid, signal.SIGCONT)

    def _start(self, name, argv, env=None):
        p = Process(name, argv, self.logs, env).start()
        self.procs[name] = p
        return p

    def _wait_http(self, url, what, timeout=60, insecure=True):
        import ssl
        import urllib.request
        ctx = ssl.create_default_context()
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE

        def ok():
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                    return r.status == 200
            except Exception:
                return False
        self.wait_for(ok, what, timeout)

    def start_etcd(self):
        self.ports["etcd"], peer = free_port(), free_port()
        self._start("etcd", [
            self.bin("etcd"), "--name", "harness", "--data-dir", self.path("etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.ports['etcd']}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.ports['etcd']}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"harness=http://127.0.0.1:{peer}",
            "--log-level", "warn", "--unsafe-no-fsync"])
        self._wait_http(f"http://127.0.0.1:{self.ports['etcd']}/health", "etcd to be healthy")

    def start_apiserver(self):
        self.ports.setdefault("apiserver", free_port())
        pki = lambda f: self.path("pki", f)  # noqa: E731
        self._start("kube-apiserver", [
            self.bin("kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.ports["apiserver"]),
            "--tls-cert-file", pki("apiserver.crt"), "--tls-private-key-file", pki("apiserver.key"),
            "--client-ca-file", pki("ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", pki("sa.pub"), "--service-account-signing-key-file", pki("sa.key"),
            "--service-cluster-ip-range", "10.0.0.0/24",
            "--authorization-mode", "Node,RBAC",
            "--allow-privileged=true",  # as kubeadm and every managed cluster: the node agent is privileged
            "--endpoint-reconciler-type", "none",
            "--profiling=false", "-v", "0", *self.apiserver_args])
        self.kubeconfig("admin", {"client-certificate": pki("admin.crt"), "client-key": pki("admin.key")})
        self._wait_http(f"https://127.0.0.1:{self.ports['apiserver']}/readyz", "kube-apiserver to be ready", 120)
        # RBAC's bootstrap roles are in place once the default namespace's service account objects can be read.
        self.wait_for(lambda: self.kubectl("get", "clusterrole", "system:kube-scheduler", check=False).returncode == 0,
                      "the bootstrap RBAC roles")

    def start_controller_manager(self):
        pki = lambda f: self.path("pki", f)  # noqa: E731
        self._start("kube-controller-manager", [
            self.bin("kube-controller-manager"), "--kubeconfig", self.path("admin.kubeconfig"),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false", "--service-account-private-key-file", pki("sa.key"),
            "--root-ca-file", pki("ca.crt"), "--use-service-account-credentials=false", "-v", "0"])
        self.wait_for(lambda: self.kubectl("get", "sa", "default", "-n", "default", check=False).returncode == 0,
                      "the default service account (kube-controller-manager)", 90)

    def start_tessera_scheduler(self, replica="r1"):
        name = f"tessera-scheduler-{replica}"
        self.ports.setdefault(name, free_port())
        self.ports.setdefault(name + "-webhook", free_port())
        # The chart's tessera-quotas ConfigMap, mounted as a file: no quota until a test writes one.
        if not os.path.exists(self.quota_file()):
            self.write_quotas([])
        p = self._start(name, [
            self.tessera("tessera-scheduler"), "--kubeconfig", self.scheduler_kubeconfig,
            "--leader-elect-lease", "tessera-scheduler", "--leader-elect-namespace", "tessera-system",
            "--identity", replica,
            "--listen", f"127.0.0.1:{self.ports[name]}",
            "--webhook-listen", f"127.0.0.1:{self.ports[name + '-webhook']}",
            "--tls-cert", self.path("pki", "webhook.crt"), "--tls-key", self.path("pki", "webhook.key"),
            "--quota-file", self.quota_file(),
            # As a cluster whose HAMi chart renamed one resource (resourceMemPercentage): the migration tests use it.
            "--hami-resource-names", f"memory-percentage={RENAMED_HAMI_MEMORY_PERCENT}",
            *self.scheduler_args], env=dict(os.environ, TESSERA_LOG=os.environ.get("TESSERA_SCHEDULER_LOG", "info")))
        self._wait_http(f"http://127.0.0.1:{self.ports[name]}/healthz", f"{name} to serve", 60)
        readyz = f"http://127.0.0.1:{self.ports[name]}/readyz"
        for proxy, port in ((self.extender_proxy, self.ports[name]), (self.webhook_proxy, self.ports[name + "-webhook"])):
            if (port, readyz) not in proxy.backends:
                proxy.backends.append((port, readyz))
        return p

    def quota_file(self):
        return self.path("quotas.yaml")

    def write_quotas(self, quotas):
        """Replaces the quota file as a ConfigMap update does (a new file renamed over the old one); returns at
        once: tessera-scheduler logs "GPU quotas in force" when it has read it."""
        tmp = self.quota_file() + ".tmp"
        with open(tmp, "w") as f:
            yaml.safe_dump({"apiVersion": "tessera.dev/v1", "kind": "GpuQuotas", "quotas": quotas}, f)
        os.replace(tmp, self.quota_file())

    def extender_url(self, replica=None):
        """The extender of one replica, or (None) the Service's address, which reaches the leader."""
        if replica is None and not self.service_proxy:
            replica = "r1"
        if replica is None:
            return f"http://127.0.0.1:{self.extender_proxy.port}"
        return f"http://127.0.0.1:{self.ports['tessera-scheduler-' + replica]}"

    def register_webhooks(self, port=None):
        """deploy/scheduler/50-webhooks.yaml as shipped, but for the address: the Service's stand-in on loopback
        (there is no cluster network here), or `port` (a test's), with this harness's CA; and, as the manifest
        asks of a cluster that renamed HAMi's names, the renamed one added to its matchConditions."""
        with open(os.path.join(self.src, "deploy/scheduler/50-webhooks.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        with open(self.path("pki", "ca.crt"), "rb") as f:
            ca = base64.b64encode(f.read()).decode()
        if port is None:
            port = self.webhook_proxy.port if self.service_proxy else self.ports["tessera-scheduler-r1-webhook"]
        for d in docs:
            for w in d["webhooks"]:
                path = w["clientConfig"]["service"]["path"]
                w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                for m in w.get("matchConditions", []) if w["name"] == "mutate.tessera.dev" else []:
                    last = "'volcano.sh/vgpu-memory-percentage'"
                    assert last in m["expression"], m["expression"]
                    m["expression"] = m["expression"].replace(last, f"{last}, '{RENAMED_HAMI_MEMORY_PERCENT}'")
        self.apply(yaml.safe_dump_all(docs))

    def start_kube_schedulers(self):
        # The cluster's default scheduler, for every pod that is not Tessera's.
        self._start("kube-scheduler-default", [
            self.bin("kube-scheduler"), "--kubeconfig", self.path("admin.kubeconfig"),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()), "--leader-elect=false", "-v", "0"])
        self.start_tessera_kube_scheduler()

    def start_tessera_kube_scheduler(self):
        """deploy/scheduler/20-kube-scheduler-config.yaml's KubeSchedulerConfiguration as shipped, but for the
        extender's address (loopback instead of the Service) and the client's kubeconfig."""
        with open(os.path.join(self.src, "deploy/scheduler/20-kube-scheduler-config.yaml")) as f:
            cm = yaml.safe_load(f)
        config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
        config["clientConnection"] = {"kubeconfig": self.kube_scheduler_kubeconfig}
        for e in config["extenders"]:
            e["urlPrefix"] = self.extender_url() + "/scheduler"
        path = self.path("tessera-kube-scheduler.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self._start("kube-scheduler-tessera", [
            self.bin("kube-scheduler"), "--config", path, "--bind-address", "127.0.0.1",
            "--secure-port", str(free_port()), "-v", os.environ.get("TESSERA_HARNESS_SCHEDULER_V", "0")])

    def start_runtime(self):
        self._start("cri-fake", [self.bin("cri-fake"), "--listen", self.path("cri.sock"),
                                 "--record", self.path("containers.jsonl")])
        self.wait_for(lambda: os.path.exists(self.path("cri.sock")), "cri-fake's socket")

    def start_kubelet(self):
        self.ports.setdefault("kubelet", free_port())
        self.ports.setdefault("kubelet-healthz", free_port())
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # This machine mounts cgroup v1; the kubelet refuses it unless told (validation_linux.go).
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "containerRuntimeEndpoint": "unix://" + self.path("cri.sock"),
            "address": "127.0.0.1", "port": self.ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.ports["kubelet-healthz"],
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": self.path("pki", "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "resolvConf": "", "maxPods": 250, "serializeImagePulls": False,
            "syncFrequency": "5s", "nodeStatusUpdateFrequency": "4s",
            "localStorageCapacityIsolation": False,
        }
        path = self.path("kubelet.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self._start("kubelet", [
            self.bin("kubelet"), "--config", path, "--kubeconfig", self.path("admin.kubeconfig"),
            "--root-dir", KUBELET_ROOT, "--hostname-override", NODE, "--cert-dir", self.path("kubelet-pki"),
            "-v", "1"])
        self.wait_for(self._node_ready, f"node {NODE} to be Ready", 120)

    def _node_ready(self):
        r = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        node = json.loads(r.stdout)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def node_agent_argv(self):
        """deploy/node/daemonset.yaml's tessera-node command, with its host paths under the work directory and
        fake GPUs instead of NVML."""
        with open(os.path.join(self.src, "deploy/node/daemonset.yaml")) as f:
            ds = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "DaemonSet"][0]
        container = ds["spec"]["template"]["spec"]["containers"][0]
        # The kubelet's paths are the shipped ones (KUBELET_ROOT); the agent's state directory is this run's own.
        rebase = {"/var/lib/tessera": self.path("tessera")}
        argv = [self.tessera("tessera-node")]
        for a in container["command"][1:] + container.get("args", []):
            a = a.replace("$(NODE_NAME)", NODE)
            for old, new in rebase.items():
                a = a.replace("=" + old, "=" + new)
            if a.startswith("--metrics-listen="):
                self.ports.setdefault("node-metrics", free_port())
                a = f"--metrics-listen=127.0.0.1:{self.ports['node-metrics']}"
            if a.startswith("--dra-fallback-after=") and self.dra_fallback_after is not None:
                a = f"--dra-fallback-after={self.dra_fallback_after}"
            argv.append(a)
        argv += ["--kubeconfig", self.node_kubeconfig, "--fake-gpus", os.path.join(self.src, self.fake_gpus),
                 "--verbose"]
        if self.dra_gpus:
            argv += ["--dra-gpus=" + ",".join(str(i) for i in self.dra_gpus), "--cdi-dir=" + self.path("cdi")]
        return argv + self.node_args

    def install_hooks(self):
        """What the DaemonSet's install-hooks init container does: the hook libraries into the agent's state
        directory (lib/), from which the agent mounts them into every container with /etc/ld.so.preload."""
        lib = self.path("tessera", "lib")
        os.makedirs(lib, exist_ok=True)
        for name in os.listdir(os.path.join(self.build, "lib")):
            if name.startswith("libtessera-") and name.endswith(".so"):
                shutil.copy2(os.path.join(self.build, "lib", name), os.path.join(lib, name))

    def start_node_agent(self):
        os.makedirs(self.path("tessera"), exist_ok=True)
        self.install_hooks()
        before = self.plugin_registrations()
        self._start("tessera-node", self.node_agent_argv())
        self.wait_for_plugin(before)
        self.wait_for(lambda: "tessera.dev/gpu-inventory" in self.get("node", NODE)["metadata"].get("annotations", {}),
                      "the GPU inventory annotation", 60)

    def plugin_registrations(self):
        """How many device-plugin registrations the running kubelet has taken (its own log says so)."""
        kubelet = self.procs.get("kubelet")
        return kubelet.since_start().count("Got registration request from device plugin") if kubelet else 0

    def wait_for_plugin(self, before=0):
        """Until tessera-node has registered with the running kubelet (more than `before` times) and the node
        advertises every slot. The node's status alone is not enough: right after a restart it still shows what
        the previous kubelet or plugin advertised."""
        self.wait_for(lambda: self.plugin_registrations() > before,
                      "tessera-node's device plugin to register with the kubelet", 90)
        self.wait_for(lambda: self.allocatable_gpu() == (8 - len(self.dra_gpus)) * SLOTS_PER_GPU,
                      "the node to advertise tessera.dev/gpu (tessera-node's device plugin)", 90)

    def allocatable_gpu(self):
        node = self.get("node", NODE)
        return int(node["status"].get("allocatable", {}).get("tessera.dev/gpu", "0"))

    def _claim_kubelet_root(self):
        if os.path.isdir(KUBELET_ROOT) and os.listdir(KUBELET_ROOT) and \
                not os.path.exists(os.path.join(KUBELET_ROOT, MARKER)):
            raise HarnessError(f"{KUBELET_ROOT} exists and was not made by this harness (a real kubelet's?); "
                               "the cluster tier will not touch it: run it on a machine without a kubelet")
        os.makedirs(KUBELET_ROOT, exist_ok=True)
        self._lock = open(os.path.join(KUBELET_ROOT, MARKER), "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._clean_kubelet_root()

    def _clean_kubelet_root(self):
        """What an earlier run left: mounts first (the kubelet bind-mounts its root and mounts volumes), then files."""
        unmount_under(KUBELET_ROOT)
        unmount_under(self.work)
        for entry in os.listdir(KUBELET_ROOT):
            if entry != MARKER:
                path = os.path.join(KUBELET_ROOT, entry)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(path)

    def start(self, node=True):
        """The control plane, Tessera's schedulers and webhooks, and (node) the kubelet with tessera-node."""
        self._claim_kubelet_root()
        self._make_pki()
        self.start_etcd()
        self.start_apiserver()
        self.start_controller_manager()
        # deploy/'s RBAC and service accounts, as shipped; the node agent's from its DaemonSet file (the node has
        # no tessera.dev/gpu-node label, so the DaemonSet itself places nothing: tessera-node runs as a process).
        self.kubectl("apply", "-f", os.path.join(self.src, "deploy/scheduler/00-namespace.yaml"))
        self.kubectl("apply", "-f", os.path.join(self.src, "deploy/scheduler/10-rbac.yaml"))
        self.kubectl("apply", "-f", os.path.join(self.src, "deploy/node/daemonset.yaml"))
        # The binds and claim status writes of tessera-scheduler's replicas fenced by the Lease's term, as shipped.
        self.kubectl("apply", "-f", os.path.join(self.src, "deploy/scheduler/70-leader-fence.yaml"))
        front = self.api_front(self) if self.api_front else None
        self.scheduler_kubeconfig = self.token_kubeconfig("tessera-system", "tessera-scheduler", front)
        self.kube_scheduler_kubeconfig = self.token_kubeconfig("tessera-system", "tessera-kube-scheduler")
        self.node_kubeconfig = self.token_kubeconfig("kube-system", "tessera-node", front)
        self.extender_proxy = ServiceProxy("tessera-scheduler:8888")
        self.webhook_proxy = ServiceProxy("tessera-scheduler:443")
        self.start_tessera_scheduler("r1")
        self.wait_for(lambda: self.extender_proxy.ready_port is not None, "tessera-scheduler to lead and be ready")
        self.register_webhooks()
        self.start_kube_schedulers()
        if node:
            self.start_runtime()
            self.start_kubelet()
            self.start_node_agent()
        return self

    # ---- Kueue (tests/cluster/test_kueue.py) ----
    def kueue_config_dir(self):
        """Kueue's config/components (CRDs, webhook configurations): scripts/k8s-components copies them from the
        same module zip as the binary into the binary's cache directory."""
        return os.path.join(os.path.dirname(os.path.realpath(self.bin("kueue"))), "config")

    def kueue_webhook_url(self, path):
        return f"https://127.0.0.1:{self.ports['kueue-webhook']}{path}"

    def _ca_bundle(self):
        with open(self.path("pki", "ca.crt"), "rb") as f:
            return base64.b64encode(f.read()).decode()

    def start_kueue(self, feature_gates=(), resources=None):
        """Kueue's controller manager as its config/default deploys it, but out of cluster like tessera-scheduler:
        the admin kubeconfig, its webhook server on loopback with this harness's serving certificate (Kueue's
        internal certificate management off), no leader election, the pod integration only (pods with the
        kueue.x-k8s.io/queue-name label), the visibility API server off (it is an aggregated API server, which
        needs a Service). Its CRDs are the module's own, with their conversion webhook at the loopback URL."""
        if not os.access(self.bin("kueue"), os.X_OK):
            raise HarnessError(f"kueue is not in {self.k8s_bin}: run scripts/k8s-components first")
        config_dir = self.kueue_config_dir()
        self.ports.setdefault("kueue-webhook", free_port())
        self.ports.setdefault("kueue-health", free_port())
        certs = self.path("kueue-certs")
        os.makedirs(certs, exist_ok=True)
        shutil.copy(self.path("pki", "webhook.crt"), os.path.join(certs, "tls.crt"))
        shutil.copy(self.path("pki", "webhook.key"), os.path.join(certs, "tls.key"))
        self.kubectl("create", "namespace", "kueue-system", check=False)
        # The CRDs, with the conversion webhook config/components/crd/patches enables (served by the manager).
        converted = set()
        patches = os.path.join(config_dir, "crd", "patches")
        for name in sorted(os.listdir(patches)):
            with open(os.path.join(patches, name)) as f:
                for d in yaml.safe_load_all(f):
                    if d and d.get("kind") == "CustomResourceDefinition" and \
                            d.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
                        converted.add(d["metadata"]["name"])
        crds = []
        bases = os.path.join(config_dir, "crd", "bases")
        for name in sorted(os.listdir(bases)):
            with open(os.path.join(bases, name)) as f:
                crd = yaml.safe_load(f)
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": self.kueue_webhook_url("/convert"), "caBundle": self._ca_bundle()},
                    "conversionReviewVersions": ["v1"]}}
            crds.append(crd)
        # Server-side: the Workload CRD is too large for client-side apply's last-applied annotation.
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds), timeout=120)
        for crd in crds:
            self.kubectl("wait", "--for", "condition=Established", "--timeout=60s", "crd/" + crd["metadata"]["name"],
                         timeout=90)
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['kueue-health']}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.ports["kueue-webhook"], "host": "127.0.0.1", "certDir": certs},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["pod"]},
            "managedJobsNamespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                 "values": ["kube-system", "kueue-system", "tessera-system"]}]},
        }
        if resources:
            config["resources"] = resources
        path = self.path("kueue-config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        gates = ",".join(["VisibilityOnDemand=false", *feature_gates])
        argv = [self.bin("kueue"), "--config", path, "--feature-gates", gates,
                "--zap-log-level", os.environ.get("TESSERA_HARNESS_KUEUE_LOG", "info")]
        # Without its internal certificate management, Kueue reads its metrics server's certificate from a fixed
        # path, /etc/kueue/metrics/certs (cmd/kueue/main.go), even with metrics off. It gets one in a mount
        # namespace of its own, over a throwaway overlay of /etc: this machine's /etc is not touched.
        etc = self.path("kueue-etc")
        os.makedirs(etc, exist_ok=True)
        script = ["set -e", f"mount -t tmpfs tmpfs {etc}", f"mkdir -p {etc}/upper {etc}/work",
                  f"mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/upper,workdir={etc}/work /etc",
                  "mkdir -p /etc/kueue/metrics/certs",
                  f"cp {certs}/tls.crt {certs}/tls.key /etc/kueue/metrics/certs/",
                  "exec " + " ".join(f"'{a}'" for a in argv)]
        p = self._start("kueue", ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                        env=dict(os.environ, KUBECONFIG=self.path("admin.kubeconfig")))
        self._wait_http(f"http://127.0.0.1:{self.ports['kueue-health']}/readyz", "kueue to be ready", 120)
        return p

    def register_kueue_webhooks(self, mutating_name="kueue-mutating-webhook-configuration",
                                validating_name="kueue-validating-webhook-configuration"):
        """config/components/webhook's configurations (the names config/default's namePrefix gives them, unless
        told otherwise: the API server calls mutating configurations in the order of their names), with the
        namespaceSelectors its kustomization adds, the loopback URL and this harness's CA; only the webhooks of
        Kueue's own objects and of pods (the one integration enabled): another integration's webhook would refuse
        every Deployment or Job with "not found"."""
        config_dir = self.kueue_config_dir()
        with open(os.path.join(config_dir, "webhook", "manifests.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        selectors = {}
        with open(os.path.join(config_dir, "webhook", "kustomization.yaml")) as f:
            for patch in yaml.safe_load(f).get("patches", []):
                for d in yaml.safe_load_all(patch.get("patch", "")):
                    for w in (d or {}).get("webhooks", []):
                        if "namespaceSelector" in w:
                            selectors[(d["kind"], w["name"])] = w["namespaceSelector"]
        names = {"MutatingWebhookConfiguration": mutating_name, "ValidatingWebhookConfiguration": validating_name}
        out = []
        for d in docs:
            keep = []
            for w in d["webhooks"]:
                rules = w.get("rules", [])
                if not any("kueue.x-k8s.io" in r["apiGroups"] or ("" in r["apiGroups"] and "pods" in r["resources"])
                           for r in rules):
                    continue
                w["clientConfig"] = {"url": self.kueue_webhook_url(w["clientConfig"]["service"]["path"]),
                                     "caBundle": self._ca_bundle()}
                if (d["kind"], w["name"]) in selectors:
                    w["namespaceSelector"] = selectors[(d["kind"], w["name"])]
                keep.append(w)
            d["webhooks"] = keep
            d["metadata"] = {"name": names[d["kind"]]}
            out.append(d)
        self.apply(yaml.safe_dump_all(out))
        return out

    def stop(self):
        # The kubelet first (it talks to the others), the store last.
        order = ["tessera-node", "kubelet", "cri-fake"] + [n for n in self.procs if n.startswith("kube-scheduler")] + \
            [n for n in self.procs if n.startswith("tessera-scheduler")] + \
            ["kueue", "kube-controller-manager", "kube-apiserver", "etcd"]
        for name in order:
            if name in self.procs:
                self.procs[name].stop()
        for proxy in (getattr(self, "extender_proxy", None), getattr(self, "webhook_proxy", None)):
            if proxy:
                proxy.close()
        if getattr(self, "_lock", None):
            self._clean_kubelet_root()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        if getattr(self, "_lock", None):
            self._lock.close()
            self._lock = None
        if exc[0] is None and not self.keep:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.work)
        return False
