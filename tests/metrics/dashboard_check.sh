#!/usr/bin/env bash
# Builds tools/dashboard-check and its render command (pinned by their go.mod and go.sum) and runs them on the
# chart's dashboard against the scrapes tests/metrics/scrape.py left (ctest fixture metrics_scrape): the dashboard
# must decode strictly as a Grafana dashboard, every query must name only metric families tessera-node or
# tessera-scheduler export, and every panel's queries must evaluate (Prometheus' engine) to some series.
#   dashboard_check.sh SOURCE_DIR BINARY_DIR SCRAPE_DIR
set -euo pipefail
src="$1"; build="$2"; scrapes="$3"
if ! command -v go >/dev/null 2>&1; then
  echo "FAIL: the Go toolchain is needed to build tools/dashboard-check (go 1.26 or newer on PATH; it also" \
       "builds the cluster tier's Kubernetes, scripts/k8s-components)" >&2
  exit 1
fi
for f in node.prom scheduler.prom; do
  [[ -s "$scrapes/$f" ]] || { echo "FAIL: no $scrapes/$f: the metrics_promtool test writes it" >&2; exit 1; }
done
mkdir -p "$build/tools"
(cd "$src/tools/dashboard-check" &&
  GOFLAGS=-mod=readonly GOTOOLCHAIN=local go build -trimpath -o "$build/tools/dashboard-check" . &&
  GOFLAGS=-mod=readonly GOTOOLCHAIN=local go build -trimpath -o "$build/tools/dashboard-render" ./render)
status=0
for dashboard in "$src"/deploy/helm/tessera/dashboards/*.json; do
  "$build/tools/dashboard-check" -dashboard "$dashboard" -scrape "$scrapes/node.prom" \
    -scrape "$scrapes/scheduler.prom" || status=1
  # Every panel's PromQL through Prometheus' own engine on the two scrapes: it must evaluate and return series
  # (what docs/dashboard.svg is drawn from; this picture goes to the build directory, not docs/).
  "$build/tools/dashboard-render" -require-data -dashboard "$dashboard" -scrapes "$scrapes" \
    -o "$scrapes/$(basename "$dashboard" .json).svg" || status=1
done
exit $status
