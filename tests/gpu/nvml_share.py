#!/usr/bin/env python3
"""The GPU time a process got, as the driver measures it: NVML's per-process SM utilisation
(nvmlDeviceGetProcessUtilization, what `nvidia-smi pmon` shows), sampled while it runs. torch_spin.py starts
this outside the hook (no LD_PRELOAD) and reads one JSON line back:

  nvml_share.py PID SECONDS   ->  {"sm_percent": [whole, first half, second half],
                                   "device_percent": [whole, first, second], "sm_clock_mhz": .., "samples": N,
                                   "device_series": [[unix time, percent], ...]}

CUDA events cannot give this: a throttled launch waits on the CPU before its kernel is queued, so the time
between two events counts the wait as well. The per-process figure holds for a process alone on the GPU; two
time-sliced processes are each counted while the other runs too (30/60 side by side read 73 and 39 on an
H100), so shares.py splits the device-wide figure by the work each did instead."""
import ctypes
import json
import sys
import time


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main():
    pid, seconds = int(sys.argv[1]), float(sys.argv[2])
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    start_us = int(time.time() * 1e6)
    last = ctypes.c_ulonglong(start_us)
    seen = {}  # timestamp -> smUtil of this pid
    device, clocks = [], []
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.5)
        n = ctypes.c_uint(0)
        nvml.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(n), last)  # asks how many
        if n.value:
            buf = (Sample * (n.value + 8))()
            n = ctypes.c_uint(n.value + 8)
            if nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), last) == 0:
                for s in buf[: n.value]:
                    if s.pid == pid and s.timeStamp > start_us:
                        seen[s.timeStamp] = s.smUtil
                    last = ctypes.c_ulonglong(max(last.value, s.timeStamp))
        u = Utilization()
        if nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)) == 0:
            device.append((time.time() * 1e6, u.gpu))
        mhz = ctypes.c_uint()
        if nvml.nvmlDeviceGetClockInfo(dev, 1, ctypes.byref(mhz)) == 0:  # NVML_CLOCK_SM
            clocks.append(mhz.value)
    mid = start_us + seconds * 5e5
    mean = lambda xs: round(sum(xs) / len(xs), 2) if xs else None
    halves = lambda pairs: [mean([v for _, v in pairs]), mean([v for t, v in pairs if t < mid]),
                            mean([v for t, v in pairs if t >= mid])]
    print(json.dumps({"sm_percent": halves(list(seen.items())), "device_percent": halves(device),
                      "sm_clock_mhz": mean(clocks), "samples": len(seen),
                      "device_series": [[round(t / 1e6, 3), v] for t, v in device]}), flush=True)


if __name__ == "__main__":
    main()
