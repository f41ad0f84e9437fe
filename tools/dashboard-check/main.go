// dashboard-check: checks the Grafana dashboard the Helm chart ships (deploy/helm/tessera/dashboards/) against
// Grafana's own schema and against what Tessera's binaries export.
//
//	dashboard-check -dashboard FILE.json -scrape node.prom -scrape scheduler.prom
//
// It fails when
//   - the dashboard does not decode strictly into the Grafana Foundation SDK's dashboard type (an unknown field,
//     a field of the wrong type, a required field missing, in the dashboard, a panel, its options or its queries);
//   - a panel has no title, no grid position, no query, or overlaps another panel;
//   - a query is not a Prometheus query, or its PromQL does not parse (Prometheus' own parser, with Grafana's
//     variables such as $__rate_interval and $Hostname filled in);
//   - a query or a template variable names a metric that no scrape declares (the `# TYPE` lines of real scrapes
//     of tessera-node and tessera-scheduler, written by tests/metrics/scrape.py).
//
// Pinned by go.mod and go.sum (-mod=readonly); built and run by tests/metrics/dashboard_check.sh (ctest
// dashboard_check).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
)

type scrapes []string

func (s *scrapes) String() string     { return strings.Join(*s, ",") }
func (s *scrapes) Set(v string) error { *s = append(*s, v); return nil }

// families reads the metric names a scrape declares: every `# TYPE` family, and for histograms and summaries
// the series names PromQL selects (_bucket, _sum, _count).
func families(paths []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 1<<20), 1<<26)
		for s.Scan() {
			words := strings.Fields(s.Text())
			if len(words) != 4 || words[0] != "#" || words[1] != "TYPE" {
				continue
			}
			out[words[2]] = words[3]
			if words[3] == "histogram" || words[3] == "summary" {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					out[words[2]+suffix] = words[3]
				}
			}
		}
		f.Close()
		if err := s.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no metric family in %v: run tests/metrics/scrape.py first (ctest metrics_promtool)", paths)
	}
	return out, nil
}

var (
	intervalVar = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)
	otherVar    = regexp.MustCompile(`\$\{[A-Za-z0-9_:]+\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z0-9_]+\]\]`)
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
)

// expand fills in Grafana's variables as Grafana would before sending the query: a duration for the interval
// variables, a value for the others (they stand in label matchers).
func expand(expr string) string {
	return otherVar.ReplaceAllString(intervalVar.ReplaceAllString(expr, "5m"), "x")
}

// metricNames parses a PromQL expression and returns the metric names its selectors name.
func metricNames(p parser.Parser, expr string) ([]string, error) {
	node, err := p.ParseExpr(expand(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		names = append(names, name)
		return nil
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("selects no metric")
	}
	return names, nil
}

// failed: the SDK's decoders return their list of errors as an error even when the list is empty.
func failed(err error) bool {
	var list cog.BuildErrors
	if errors.As(err, &list) {
		return len(list) > 0
	}
	return err != nil
}

func main() {
	path := flag.String("dashboard", "", "the dashboard JSON")
	var scrapeFiles scrapes
	flag.Var(&scrapeFiles, "scrape", "a /metrics scrape (Prometheus text); repeat for each binary")
	flag.Parse()
	if *path == "" || len(scrapeFiles) == 0 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check -dashboard FILE.json -scrape node.prom -scrape scheduler.prom")
		os.Exit(2)
	}
	known, err := families(scrapeFiles)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-check:", err)
		os.Exit(2)
	}
	raw, err := os.ReadFile(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-check:", err)
		os.Exit(2)
	}
	// Panel options and queries decode into their plugins' types only when the plugins are registered.
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict(raw); failed(err) {
		fmt.Fprintf(os.Stderr, "dashboard-check: %s does not decode strictly as a Grafana dashboard:\n%v\n", *path, err)
		os.Exit(1)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if err := d.Validate(); failed(err) {
		bad("the dashboard does not validate: %v", err)
	}
	if d.Title == nil || *d.Title == "" || d.Uid == nil || *d.Uid == "" {
		bad("the dashboard needs a title and a uid")
	}

	p := parser.NewParser(parser.Options{})
	used := map[string]bool{}
	check := func(where, expr string) {
		names, err := metricNames(p, expr)
		if err != nil {
			bad("%s: %q: %v", where, expr, err)
			return
		}
		for _, n := range names {
			if _, ok := known[n]; !ok {
				bad("%s: %q names %s, which neither tessera-node nor tessera-scheduler exports", where, expr, n)
			}
			used[n] = true
		}
	}

	// The panels once more, one at a time: the SDK's PanelOrRowPanel decoder (v0.0.22) takes the empty error list
	// a panel's strict decoder returns for an error and drops the panel (Dashboard.Panels then holds neither a
	// Panel nor a RowPanel), so each panel is decoded here as the dashboard decoder would, and checked.
	var rawPanels struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &rawPanels); err != nil {
		bad("panels: %v", err)
	}
	var panels []dashboard.Panel
	for i, rp := range rawPanels.Panels {
		var kind struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(rp, &kind)
		if kind.Type == "row" {
			var row dashboard.RowPanel
			if err := row.UnmarshalJSONStrict(rp); failed(err) {
				bad("panels[%d] (row): %v", i, err)
			}
			panels = append(panels, row.Panels...)
			continue
		}
		var panel dashboard.Panel
		if err := panel.UnmarshalJSONStrict(rp); failed(err) {
			bad("panels[%d]: %v", i, err)
		}
		// The same for its queries (the variant decoder drops a query the same way): each must decode strictly
		// as a Prometheus query.
		var parts struct {
			Targets []json.RawMessage `json:"targets"`
		}
		_ = json.Unmarshal(rp, &parts)
		panel.Targets = nil
		for j, t := range parts.Targets {
			q := &prometheus.Dataquery{}
			if err := q.UnmarshalJSONStrict(t); failed(err) {
				bad("panels[%d].targets[%d]: not a Prometheus query: %v", i, j, err)
				continue
			}
			if q.Datasource == nil || q.Datasource.Type == nil || *q.Datasource.Type != "prometheus" {
				bad("panels[%d].targets[%d]: the datasource must be of type prometheus", i, j)
			}
			panel.Targets = append(panel.Targets, q)
		}
		panels = append(panels, panel)
	}
	if len(panels) == 0 {
		bad("the dashboard has no panel")
	}
	type box struct {
		title      string
		x, y, w, h uint32
	}
	var boxes []box
	queries := 0
	for i, panel := range panels {
		title := ""
		if panel.Title != nil {
			title = *panel.Title
		}
		where := fmt.Sprintf("panel %d %q", i, title)
		if title == "" {
			bad("%s: no title", where)
		}
		if panel.GridPos == nil || panel.GridPos.W == 0 || panel.GridPos.H == 0 {
			bad("%s: no grid position", where)
		} else {
			g := panel.GridPos
			if g.X+g.W > 24 {
				bad("%s: wider than the grid's 24 columns", where)
			}
			for _, o := range boxes {
				if g.X < o.x+o.w && o.x < g.X+g.W && g.Y < o.y+o.h && o.y < g.Y+g.H {
					bad("%s overlaps panel %q", where, o.title)
				}
			}
			boxes = append(boxes, box{title, g.X, g.Y, g.W, g.H})
		}
		if len(panel.Targets) == 0 {
			bad("%s: no query", where)
		}
		for j, t := range panel.Targets {
			q, ok := t.(*prometheus.Dataquery)
			if !ok {
				bad("%s target %d: not a Prometheus query (%T); give the panel a prometheus datasource", where, j, t)
				continue
			}
			queries++
			check(fmt.Sprintf("%s target %d", where, j), q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" || v.Query == nil {
			continue
		}
		var text string
		if v.Query.String != nil {
			text = *v.Query.String
		} else if q, ok := v.Query.Map["query"].(string); ok {
			text = q
		}
		if m := labelValues.FindStringSubmatch(text); m != nil {
			text = m[1]
		}
		if text != "" {
			check(fmt.Sprintf("variable %q", v.Name), text)
		}
	}
	if len(problems) > 0 {
		for _, pr := range problems {
			fmt.Fprintln(os.Stderr, "dashboard-check:", pr)
		}
		os.Exit(1)
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Printf("dashboard-check: %s: %d panels, %d queries, all decoded strictly; the %d metrics they name are all exported: %s\n",
		*path, len(panels), queries, len(names), strings.Join(names, " "))
}
