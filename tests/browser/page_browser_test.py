#!/usr/bin/env python3
"""The operators' page in a real browser: what a person sees on it.

A standalone tessera-scheduler (cluster file, page on) gets pods through its extender verbs as kube-scheduler
sends them (filter, then bind); Debian's headless Chromium opens the page through chromedriver, and the test
reads what is drawn:
  - the number of GPUs, in the header and as drawn GPUs;
  - a tenant's share on the GPU the scheduler put it on (the GPU read from the scheduler's own /inspect);
  - a pending pod with the reason its filter gave;
  - a pod bound after the page was opened appearing without a reload.
Waits are generous deadlines on what is checked (the page polls every 2 s), never a sleep that must be long enough.

  page_browser_test.py --scheduler build/bin/tessera-scheduler

Exit 77 (ctest's skip) when chromium, chromedriver or selenium is missing; scripts/setup installs them.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import page_harness as h  # noqa: E402

CLUSTER = {
    "apiVersion": "tessera.dev/v1", "kind": "Cluster",
    "nodes": [
        {"name": "t4-box", "cpuMilli": 48000, "memoryMiB": 196608,
         "gpus": {"model": "T4", "count": 4, "memoryMiB": 15360}},
        {"name": "a100-box", "cpuMilli": 128000, "memoryMiB": 524288,
         "gpus": {"model": "A100-SXM4-80GB", "count": 2, "memoryMiB": 81920}},
        {"name": "v100", "cpuMilli": 32000, "memoryMiB": 131072,
         "gpus": {"model": "V100-PCIE-32GB", "count": 1, "memoryMiB": 32768}},
    ],
}
GPUS = 7


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", required=True, help="the tessera-scheduler binary")
    args = ap.parse_args()
    why = h.browser_missing()
    if why:
        print(f"SKIP: {why}")
        return h.SKIP

    from selenium.webdriver.common.by import By

    s = h.Scheduler(args.scheduler, CLUSTER)
    b = None
    try:
        s.place(h.pod("research", "train", "u-train", 60, 8192), "t4-box")
        s.place(h.pod("inference", "serve", "u-serve", 30, 4096, {"tessera.dev/priority": "high"}), "t4-box")
        # Asks more memory than any GPU has: filtered, never bound.
        huge = h.pod("batch", "huge", "u-huge", 100, 90000)
        f = s.filter(huge, ["t4-box", "a100-box", "v100"])
        if f["NodeNames"]:
            h.fail(f"batch/huge should fit nowhere: {f}")

        # Where the scheduler put research/train, as its /inspect says.
        inspect = json.loads(s.get("/inspect", port=s.port))
        train_gpu = None
        for n in inspect["nodes"]:
            for g in n["gpus"]:
                for t in g["tenants"]:
                    if t["pod"] == "research/train":
                        train_gpu = (n["name"], g["index"])
        if train_gpu is None or train_gpu[0] != "t4-box":
            h.fail(f"/inspect does not show research/train on t4-box: {inspect}")

        b = h.Browser()
        d = b.driver
        d.get(s.page_url)
        b.wait("the first render", lambda: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-renders") or 0) >= 1)
        d.execute_script("window.tesseraNotReloaded = 42;")

        # The number of GPUs: in the header, and drawn.
        if d.find_element(By.ID, "gpu-count").text != str(GPUS):
            h.fail(f"the header says {d.find_element(By.ID, 'gpu-count').text} GPUs, not {GPUS}")
        drawn = d.find_elements(By.CSS_SELECTOR, ".node .gpu")
        if len(drawn) != GPUS:
            h.fail(f"{len(drawn)} GPUs drawn, not {GPUS}")
        if len(d.find_elements(By.CSS_SELECTOR, '.node[data-node="t4-box"] .gpu')) != 4:
            h.fail("t4-box is not drawn with its 4 GPUs")

        # research/train's 60% on its GPU: drawn there, and in the node's table once the node is clicked.
        node, gpu = train_gpu
        seg = d.find_elements(By.CSS_SELECTOR,
                              f'.node[data-node="{node}"] .gpu[data-gpu="{gpu}"] .seg[data-pod="research/train"]')
        if len(seg) != 1 or seg[0].get_attribute("data-share") != "600":
            h.fail(f"research/train is not drawn at 60% on {node} GPU {gpu}")
        title = d.find_element(By.CSS_SELECTOR, f'.node[data-node="{node}"] .gpu[data-gpu="{gpu}"]').get_attribute("title")
        if "research/train [main]: 60%" not in title:
            h.fail(f"the GPU's tooltip does not name research/train's 60%: {title!r}")
        d.find_element(By.CSS_SELECTOR, f'.node[data-node="{node}"]').click()
        row = b.wait("research/train's row in the node's table",
                     lambda: d.find_element(By.CSS_SELECTOR, '#tenants tr[data-pod="research/train"]'))
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        if cells[0] != str(gpu) or not cells[5].startswith("60%") or cells[3] != "research" or "8.0 GiB" not in cells[6]:
            h.fail(f"research/train's row says {cells}; expected GPU {gpu}, 60%, research, 8.0 GiB")
        serve = d.find_element(By.CSS_SELECTOR, '#tenants tr[data-pod="inference/serve"]')
        if serve.find_elements(By.TAG_NAME, "td")[4].text != "high":
            h.fail("inference/serve is not shown as high priority")
        ns_row = d.find_element(By.CSS_SELECTOR, '#namespaces tr[data-namespace="research"]')
        if ns_row.find_elements(By.TAG_NAME, "td")[2].text != "0.60":
            h.fail(f"namespace research holds {ns_row.text!r}, not 0.60 GPU")

        # The pending pod and why it waits.
        pending = d.find_element(By.CSS_SELECTOR, '#pending tr[data-pod="batch/huge"]')
        reason = pending.find_element(By.CSS_SELECTOR, "td.reason").text
        if not reason.startswith("0 of 3 nodes fit:"):
            h.fail(f"batch/huge's reason is {reason!r}")
        if not d.find_element(By.ID, "pending-none").get_attribute("hidden"):
            h.fail("the page says no pod is waiting")

        # A pod bound now appears without a reload.
        s.place(h.pod("batch", "late", "u-late", 50, 20480), "a100-box")
        b.wait("batch/late drawn on a100-box",
               lambda: d.find_elements(By.CSS_SELECTOR, '.node[data-node="a100-box"] .seg[data-pod="batch/late"]'))
        if d.execute_script("return window.tesseraNotReloaded;") != 42:
            h.fail("the page was reloaded")
        # And the header follows: 0.6 + 0.3 + 0.5 GPUs held.
        b.wait("the header's compute held", lambda: d.find_element(By.ID, "compute-used").text.startswith("1.40 of 7"))
        print("page_browser_test: OK: 7 GPUs drawn, research/train at 60% on", node, "GPU", gpu,
              "; batch/huge pending:", reason[:80], "; batch/late appeared without a reload")
        return 0
    finally:
        if b is not None:
            b.close()
        s.close()


if __name__ == "__main__":
    sys.exit(main())
