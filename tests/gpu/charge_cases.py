#!/usr/bin/env python3
"""Issue 12's cases on a real GPU: each case runs under `tessera run` (LD_PRELOAD of libtessera-cuda.so) and
prints one JSON line with "ok". The fake driver's tests (tests/hook/cuda_footprint_test.cc) assert the same
things; these confirm them against the real driver and NVML.

  tests/gpu/charge_cases.py CASE        (from the repository root, after scripts/build; run_all.sh runs them all)

Cases (the driver API through ctypes, PyTorch where a framework's behaviour is the point):
  contexts   16 processes of one container start at once under 16 GiB (an H100's context is about 500 MiB:
             16 of them take half) and allocate 64 MiB blocks until refused:
             all initialise, and the container's charge (tessera inspect-free: NVML's per-process figures)
             ends within one block of the limit, never past it
  modules    a module loaded (and a kernel launched lazily) shows in the charge: cuMemGetInfo's free drops
  nonvml     TESSERA_REAL_LIBNVML=/nonexistent: the context is still charged (free < total right after init)
  pool       cudaMallocAsync with the release threshold at UINT64_MAX: freed memory stays charged until trimmed
  graph      a graph with an allocation node: not charged when instantiated, charged at launch, kept after the
             free, given back at cuDeviceGraphMemTrim
  prefetch   managed memory prefetched to the GPU is charged once (at allocation)
  smi        NVML's process list inside the container shows only the container's processes (and what
             nvidia-smi's shows, reported)
  capture    a global-mode capture (torch.cuda.graph) while sampled launches are measured: the capture succeeds
"""
import ctypes
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.environ.get("TESSERA") or os.path.join(ROOT, "build", "bin", "tessera")


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    return lib


def mem_info(lib):
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value, total.value


def report(**kv):
    print(json.dumps(kv))
    sys.exit(0 if kv.get("ok") else 1)


def run_under(args, env=None, **tessera):
    cmd = [TESSERA, "run"]
    for k, v in tessera.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    return subprocess.run(cmd + ["--"] + args, env={**os.environ, **(env or {})}, capture_output=True, text=True)


def case_contexts():
    if len(sys.argv) > 2:  # one worker: init, wait for the start signal, fill, report what is left
        lib = cuda()
        print("init", flush=True)
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.001)
        got, p = 0, ctypes.c_uint64()
        while lib.cuMemAlloc_v2(ctypes.byref(p), 64 * MiB) == 0:
            got += 64 * MiB
        free, _ = mem_info(lib)
        print(got, free, flush=True)
        time.sleep(2)
        return
    import tempfile
    d = tempfile.mkdtemp()
    go = os.path.join(d, "go")
    region = os.path.join(d, "region")
    procs = [subprocess.Popen([TESSERA, "run", "--gpu-memory", "16GiB", "--region", region, "--", sys.executable,
                               __file__, "contexts", go], stdout=subprocess.PIPE, text=True) for _ in range(16)]
    inits = sum(1 for p in procs if p.stdout.readline().strip() == "init")  # all 16 contexts exist now
    open(go, "w").close()
    results = [p.stdout.readline().split() for p in procs]
    got = [int(r[0]) for r in results if len(r) == 2]
    left = [int(r[1]) for r in results if len(r) == 2]
    for p in procs:
        p.wait()
    report(case="contexts", initialised=inits, allocated=sum(got), left=max(left) if left else None,
           ok=inits == 16 and len(got) == 16 and sum(got) <= 16384 * MiB and max(left) < 64 * MiB)


def case_modules():
    lib = cuda()
    before, _ = mem_info(lib)
    import torch  # a framework's kernels, loaded lazily at their first launch
    x = torch.randn(4096, 4096, device="cuda")
    (x @ x).sum().item()
    time.sleep(0.5)  # the limiter thread trues the footprint up about four times a second
    after, _ = mem_info(lib)
    report(case="modules", free_before=before, free_after=after, ok=after < before - x.numel() * 4)


def case_nonvml():
    lib = cuda()
    free, total = mem_info(lib)
    report(case="nonvml", free=free, total=total, ok=free < total)


def case_pool():
    lib = cuda()
    pool = ctypes.c_void_p()
    assert lib.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0) == 0
    keep = ctypes.c_uint64(2**64 - 1)
    assert lib.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep)) == 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    start, _ = mem_info(lib)
    p = ctypes.c_uint64()
    assert lib.cuMemAllocAsync(ctypes.byref(p), 1024 * MiB, None) == 0
    assert lib.cuMemFreeAsync(p, None) == 0
    assert lib.cuCtxSynchronize() == 0
    kept, _ = mem_info(lib)
    assert lib.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0
    trimmed, _ = mem_info(lib)
    report(case="pool", start=start, kept=kept, trimmed=trimmed,
           ok=kept <= start - 1024 * MiB and trimmed >= start - 64 * MiB)


class PoolProps(ctypes.Structure):
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                ("locId", ctypes.c_int), ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


class AllocNodeParams(ctypes.Structure):
    _fields_ = [("poolProps", PoolProps), ("accessDescs", ctypes.c_void_p), ("accessDescCount", ctypes.c_size_t),
                ("bytesize", ctypes.c_size_t), ("dptr", ctypes.c_uint64)]


def case_graph():
    lib = cuda()
    graph, node, exe = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cuGraphCreate(ctypes.byref(graph), 0) == 0
    params = AllocNodeParams()
    params.poolProps.allocType = 1  # pinned
    params.poolProps.locType = 1  # device 0
    params.bytesize = 512 * MiB
    assert lib.cuGraphAddMemAllocNode(ctypes.byref(node), graph, None, 0, ctypes.byref(params)) == 0
    assert lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)) == 0
    added, _ = mem_info(lib)
    assert lib.cuGraphLaunch(exe, None) == 0 and lib.cuCtxSynchronize() == 0
    launched, _ = mem_info(lib)
    assert lib.cuMemFree_v2(ctypes.c_uint64(params.dptr)) == 0
    freed, _ = mem_info(lib)
    assert lib.cuDeviceGraphMemTrim(0) == 0
    trimmed, _ = mem_info(lib)
    report(case="graph", added=added, launched=launched, freed=freed, trimmed=trimmed,
           ok=launched <= added - 512 * MiB and freed <= added - 512 * MiB and trimmed >= added - 64 * MiB)


def case_prefetch():
    lib = cuda()
    start, _ = mem_info(lib)
    p = ctypes.c_uint64()
    assert lib.cuMemAllocManaged(ctypes.byref(p), 256 * MiB, 1) == 0
    allocated, _ = mem_info(lib)
    assert lib.cuMemPrefetchAsync(p, ctypes.c_size_t(256 * MiB), 0, None) == 0 and lib.cuCtxSynchronize() == 0
    prefetched, _ = mem_info(lib)
    report(case="prefetch", start=start, allocated=allocated, prefetched=prefetched,
           ok=allocated <= start - 256 * MiB and abs(prefetched - allocated) < 64 * MiB)


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3 layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def nvml_processes():
    """The process list as a program calling NVML sees it (nvmlDeviceGetComputeRunningProcesses_v3)."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    infos = (ProcessInfo * 64)()
    n = ctypes.c_uint(64)
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(n), infos) == 0
    return [(infos[i].pid, infos[i].usedGpuMemory) for i in range(n.value)]


def case_smi():
    if len(sys.argv) > 2:
        lib = cuda()
        p = ctypes.c_uint64()
        lib.cuMemAlloc_v2(ctypes.byref(p), 256 * MiB)
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout
        print(json.dumps({"me": os.getpid(), "nvml": nvml_processes(), "nvidia_smi": out.strip().splitlines()}))
        return
    other = subprocess.Popen([sys.executable, "-c", "import torch,time; x=torch.ones(1,device='cuda'); "
                              "time.sleep(20)"])
    time.sleep(8)
    r = run_under([sys.executable, __file__, "smi", "inner"], gpu_memory="4GiB")
    other.kill()
    inner = json.loads(r.stdout.strip().splitlines()[-1])
    smi_pids = [int(line.split(",")[0]) for line in inner["nvidia_smi"]]
    nvml_pids = [pid for pid, _ in inner["nvml"]]
    # NVML's callers see the container's processes only. nvidia-smi (driver 580) does not reach the process
    # list through NVML's exported functions (docs/isolation.md, "What nvidia-smi shows"): reported, not judged.
    report(case="smi", nvml=inner["nvml"], nvidia_smi=inner["nvidia_smi"], other=other.pid,
           nvidia_smi_container_only=smi_pids == [inner["me"]], ok=nvml_pids == [inner["me"]])


def case_capture():
    import torch
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(20):
        y = x @ x  # sampled launches, measured by the limiter thread with cuEventQuery
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):  # global capture mode
            y = x @ x
            time.sleep(0.2)
    g.replay()
    torch.cuda.synchronize()
    report(case="capture", ok=True)


if __name__ == "__main__":
    case = sys.argv[1] if len(sys.argv) > 1 else ""
    fn = globals().get("case_" + case)
    if fn is None:
        print(__doc__)
        sys.exit(2)
    fn()
