// dashboard-render: draws a Grafana dashboard as an SVG picture from real scrapes, where no Grafana runs.
//
//	dashboard-render -dashboard FILE.json -scrapes DIR -o docs/dashboard.svg
//
// DIR is what tests/metrics/scrape.py leaves: two scrapes of each binary a few seconds apart and scrapes.json
// saying when each was taken. Their samples are loaded, at those times, into a Prometheus TSDB in a temporary
// directory, and each panel's own queries are evaluated by Prometheus' PromQL engine as instant queries at the
// second scrape (Grafana's variables filled in: every node, and $__rate_interval = 1m). The picture keeps the
// dashboard's layout (the 24-column grid, each panel's position, size and title) and shows, in each panel, every
// series the queries return with its legend and value: stat panels as numbers, time series and bar gauges as
// bars of their value at that instant (Grafana draws time series as lines over the time range; two scrapes are
// no time range).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

type target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

type panel struct {
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	GridPos     struct{ X, Y, W, H int } `json:"gridPos"`
	Targets     []target                 `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

type scrapeSet struct {
	Time  float64  `json:"time"`
	Files []string `json:"files"`
}

type row struct {
	legend string
	value  float64
	ref    int // which query of the panel
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "dashboard-render: "+format+"\n", args...)
	os.Exit(1)
}

// load appends every sample of a scrape (Prometheus text) at time t.
func load(app storage.Appender, path string, t int64) int {
	f, err := os.Open(path)
	if err != nil {
		fail("%v", err)
	}
	defer f.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(f)
	if err != nil {
		fail("%s: %v", path, err)
	}
	n := 0
	add := func(name string, m *dto.Metric, extra map[string]string, v float64) {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set("__name__", name)
		for _, lp := range m.GetLabel() {
			b.Set(lp.GetName(), lp.GetValue())
		}
		for k, val := range extra {
			b.Set(k, val)
		}
		if _, err := app.Append(0, b.Labels(), t, v); err != nil {
			fail("%s: %s: %v", path, name, err)
		}
		n++
	}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m, nil, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", m, map[string]string{"le": strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)}, float64(b.GetCumulativeCount()))
				}
				add(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				add(name+"_sum", m, nil, h.GetSampleSum())
				add(name+"_count", m, nil, float64(h.GetSampleCount()))
			case dto.MetricType_UNTYPED:
				add(name, m, nil, m.GetUntyped().GetValue())
			}
		}
	}
	return n
}

var (
	legendVar   = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
	intervalVar = regexp.MustCompile(`\$__rate_interval|\$__interval|\$__range`)
	otherVar    = regexp.MustCompile(`\$[A-Za-z_][A-Za-z0-9_]*`)
)

func legend(format string, m labels.Labels) string {
	if format == "" {
		return m.String()
	}
	return legendVar.ReplaceAllStringFunc(format, func(s string) string {
		return m.Get(legendVar.FindStringSubmatch(s)[1])
	})
}

func formatValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	switch unit {
	case "percent":
		return fmt.Sprintf("%.3g%%", v)
	case "bytes":
		switch {
		case v >= 1<<30:
			return fmt.Sprintf("%.3g GiB", v/(1<<30))
		case v >= 1<<20:
			return fmt.Sprintf("%.3g MiB", v/(1<<20))
		default:
			return fmt.Sprintf("%.0f B", v)
		}
	case "reqps":
		return fmt.Sprintf("%.3g/s", v)
	case "s":
		if v < 1 {
			return fmt.Sprintf("%.3g ms", v*1000)
		}
		return fmt.Sprintf("%.3g s", v)
	}
	return fmt.Sprintf("%.4g", v)
}

var palette = []string{"#73bf69", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#fade2a"}

func main() {
	dashboardPath := flag.String("dashboard", "", "the dashboard JSON")
	dir := flag.String("scrapes", "", "the directory tests/metrics/scrape.py wrote (scrapes.json and the .prom files)")
	out := flag.String("o", "", "the SVG to write")
	requireData := flag.Bool("require-data", false, "fail when a panel's queries return no series (CI)")
	flag.Parse()
	if *dashboardPath == "" || *dir == "" || *out == "" {
		fail("usage: dashboard-render -dashboard FILE.json -scrapes DIR -o FILE.svg")
	}
	var dash struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	raw, err := os.ReadFile(*dashboardPath)
	if err != nil {
		fail("%v", err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		fail("%s: %v", *dashboardPath, err)
	}
	var sets map[string]scrapeSet
	raw, err = os.ReadFile(filepath.Join(*dir, "scrapes.json"))
	if err != nil {
		fail("%v (run tests/metrics/scrape.py first)", err)
	}
	if err := json.Unmarshal(raw, &sets); err != nil {
		fail("scrapes.json: %v", err)
	}

	tmp, err := os.MkdirTemp("", "dashboard-render-")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(tmp)
	opts := tsdb.DefaultOptions()
	opts.OutOfOrderTimeWindow = int64(time.Hour / time.Millisecond)
	db, err := tsdb.Open(tmp, nil, nil, opts, nil)
	if err != nil {
		fail("%v", err)
	}
	defer db.Close()
	ctx := context.Background()
	samples := 0
	for _, key := range []string{"first", "second"} {
		set, ok := sets[key]
		if !ok {
			fail("scrapes.json has no %q scrape", key)
		}
		app := db.Appender(ctx)
		for _, f := range set.Files {
			samples += load(app, filepath.Join(*dir, f), int64(set.Time*1000))
		}
		if err := app.Commit(); err != nil {
			fail("%v", err)
		}
	}
	at := time.UnixMilli(int64(sets["second"].Time * 1000))
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10000000, Timeout: time.Minute,
		LookbackDelta: 5 * time.Minute})

	results := make([][]row, len(dash.Panels))
	for i, p := range dash.Panels {
		for j, t := range p.Targets {
			expr := otherVar.ReplaceAllString(intervalVar.ReplaceAllString(t.Expr, "1m"), ".*")
			q, err := engine.NewInstantQuery(ctx, db, nil, expr, at)
			if err != nil {
				fail("panel %q: %q: %v", p.Title, t.Expr, err)
			}
			res := q.Exec(ctx)
			if res.Err != nil {
				fail("panel %q: %q: %v", p.Title, t.Expr, res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				if s, serr := res.Scalar(); serr == nil {
					results[i] = append(results[i], row{t.LegendFormat, s.V, j})
					continue
				}
				fail("panel %q: %q: %v", p.Title, t.Expr, err)
			}
			var rows []row
			for _, s := range vec {
				rows = append(rows, row{legend(t.LegendFormat, s.Metric), s.F, j})
			}
			sort.Slice(rows, func(a, b int) bool { return rows[a].legend < rows[b].legend })
			results[i] = append(results[i], rows...)
			q.Close()
		}
		// Series of one subject side by side ("GPU 0 allocated", "GPU 0 used"): sort by legend, query order kept
		// within a subject.
		if p.Type != "stat" {
			sort.SliceStable(results[i], func(a, b int) bool {
				return subject(results[i][a].legend) < subject(results[i][b].legend)
			})
		}
	}
	if *requireData {
		for i, p := range dash.Panels {
			if len(results[i]) == 0 {
				fail("panel %q: its queries return no series on these scrapes", p.Title)
			}
		}
	}
	writeSVG(*out, dash.Title, dash.Panels, results, at, sets, samples, *dashboardPath)
}

// subject: a legend less its last word ("t4-box GPU 0 used" -> "t4-box GPU 0").
func subject(l string) string {
	if i := strings.LastIndex(l, " "); i > 0 {
		return l[:i]
	}
	return l
}

func writeSVG(path, title string, panels []panel, results [][]row, at time.Time, sets map[string]scrapeSet,
	samples int, source string) {
	const colW, rowH, pad, top = 50.0, 30.0, 4.0, 100.0
	maxY := 0
	for _, p := range panels {
		if p.GridPos.Y+p.GridPos.H > maxY {
			maxY = p.GridPos.Y + p.GridPos.H
		}
	}
	width, height := 24*colW, top+float64(maxY)*rowH+30
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#111217"/>`+"\n")
	fmt.Fprintf(&b, `<text x="12" y="26" font-size="18" fill="#d8d9da">%s</text>`+"\n", esc(title))
	gap := sets["second"].Time - sets["first"].Time
	lines := []string{
		fmt.Sprintf("Rendered from %s by tools/dashboard-check/render, not by Grafana: each panel's own PromQL, evaluated by Prometheus' engine", filepath.Base(source)),
		fmt.Sprintf("at the second of two real scrapes (%.1f s apart, %d samples) of tessera-node and tessera-scheduler run by tests/metrics/scrape.py:", gap, samples),
		"fake T4 GPUs, hooked cuda_probe tenants on the fake CUDA driver. Time series are drawn as bars of their value at that instant.",
	}
	for i, l := range lines {
		fmt.Fprintf(&b, `<text x="12" y="%d" font-size="11" fill="#8e8e8e">%s</text>`+"\n", 46+i*15, esc(l))
	}
	for i, p := range panels {
		x := float64(p.GridPos.X)*colW + pad
		y := top + float64(p.GridPos.Y)*rowH + pad
		w := float64(p.GridPos.W)*colW - 2*pad
		h := float64(p.GridPos.H)*rowH - 2*pad
		fmt.Fprintf(&b, `<g><rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" rx="3" fill="#181b1f" stroke="#2c3235"/>`+"\n", x, y, w, h)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="13" fill="#d8d9da">%s</text>`+"\n", x+8, y+18, esc(p.Title))
		rows := results[i]
		unit := p.FieldConfig.Defaults.Unit
		if len(rows) == 0 {
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="14" fill="#8e8e8e" text-anchor="middle">No data</text>`+"\n", x+w/2, y+h/2+6)
			b.WriteString("</g>\n")
			continue
		}
		if p.Type == "stat" {
			n := float64(len(rows))
			for k, r := range rows {
				cx := x + w*(float64(k)+0.5)/n
				fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="30" fill="#73bf69" text-anchor="middle">%s</text>`+"\n", cx, y+h/2+14, esc(formatValue(r.value, unit)))
				if len(rows) > 1 || r.legend != "" {
					fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" fill="#8e8e8e" text-anchor="middle">%s</text>`+"\n", cx, y+h-8, esc(r.legend))
				}
			}
			b.WriteString("</g>\n")
			continue
		}
		// Bars: one line per series, the legend left, the value right, bars scaled to the panel's largest value.
		maxV := 0.0
		for _, r := range rows {
			if !math.IsNaN(r.value) && r.value > maxV {
				maxV = r.value
			}
		}
		labelW := math.Min(w*0.45, 230)
		valueW := 70.0
		avail := h - 30
		line := math.Min(16, avail/float64(len(rows)))
		font := math.Min(11, line-2)
		for k, r := range rows {
			ly := y + 28 + float64(k)*line
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="%.1f" fill="#c7d0d9">%s</text>`+"\n", x+8, ly+font, font, esc(r.legend))
			barX, barW := x+8+labelW, w-16-labelW-valueW
			frac := 0.0
			if maxV > 0 && !math.IsNaN(r.value) {
				frac = r.value / maxV
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", barX, ly+1, math.Max(frac*barW, 1), line-3, palette[r.ref%len(palette)])
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="%.1f" fill="#c7d0d9" text-anchor="end">%s</text>`+"\n", x+w-8, ly+font, font, esc(formatValue(r.value, unit)))
		}
		b.WriteString("</g>\n")
	}
	fmt.Fprintf(&b, `<text x="12" y="%.0f" font-size="10" fill="#8e8e8e">Evaluated at %s. Bar colours: first query of a panel green, second blue, third orange.</text>`+"\n", height-10, at.UTC().Format(time.RFC3339))
	b.WriteString("</svg>\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		fail("%v", err)
	}
	fmt.Printf("dashboard-render: %s: %d panels\n", path, len(panels))
}
