package main

// Tests of deploy/: the Grafana dashboard and the Prometheus alert rules
// use only metrics a running worker exports, and the rules hold the
// README's example alerts.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// deployDir is the repository's deploy/ from this package's directory.
var deployDir = filepath.Join("..", "..", "deploy")

// alertRule is one rule of a Prometheus rules file.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// readRules parses deploy/prometheus/outbox-alerts.yaml, strictly (an
// unknown field is an error), and checks each rule's shape.
func readRules(t *testing.T) []alertRule {
	t.Helper()
	f, err := os.Open(filepath.Join(deployDir, "prometheus", "outbox-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var file struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("outbox-alerts.yaml: %v", err)
	}
	var rules []alertRule
	seen := map[string]bool{}
	for _, g := range file.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("outbox-alerts.yaml: group %q has no name or no rules", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || r.Record != "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("outbox-alerts.yaml: rule %+v: want an alert with an expr", r)
			}
			if seen[r.Alert] {
				t.Errorf("outbox-alerts.yaml: alert %s twice", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("outbox-alerts.yaml: %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("outbox-alerts.yaml: %s lacks a severity label, a summary or a description", r.Alert)
			}
		}
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("outbox-alerts.yaml has no rule")
	}
	return rules
}

// dashboardQueries returns every query of deploy/grafana/outbox-relay.json:
// each target's expr and each query variable's query, with where it is.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "grafana", "outbox-relay.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string           `json:"uid"`
		Title      string           `json:"title"`
		Panels     []map[string]any `json:"panels"`
		Templating struct {
			List []map[string]any `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("outbox-relay.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("outbox-relay.json: uid %q, title %q; want both", dash.UID, dash.Title)
	}
	queries := map[string]string{}
	ids := map[float64]bool{}
	var walk func(panels []map[string]any)
	walk = func(panels []map[string]any) {
		for _, p := range panels {
			id, _ := p["id"].(float64)
			title, _ := p["title"].(string)
			if ids[id] || title == "" {
				t.Errorf("outbox-relay.json: panel %v %q: want a unique id and a title", p["id"], title)
			}
			ids[id] = true
			targets, _ := p["targets"].([]any)
			if p["type"] != "row" && len(targets) == 0 {
				t.Errorf("outbox-relay.json: panel %q has no query", title)
			}
			for i, tg := range targets {
				m, _ := tg.(map[string]any)
				expr, _ := m["expr"].(string)
				if expr == "" || m["refId"] == nil {
					t.Errorf("outbox-relay.json: panel %q target %d: want an expr and a refId", title, i)
				}
				queries[fmt.Sprintf("panel %q, target %v", title, m["refId"])] = expr
			}
			if sub, ok := p["panels"].([]any); ok {
				var nested []map[string]any
				for _, s := range sub {
					if m, ok := s.(map[string]any); ok {
						nested = append(nested, m)
					}
				}
				walk(nested)
			}
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v["type"] != "query" {
			continue
		}
		q := v["query"]
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		s, _ := q.(string)
		queries[fmt.Sprintf("variable %v", v["name"])] = s
	}
	return queries
}

// deployMetrics returns every metric name the dashboard and the rules use,
// each with the first place that uses it.
func deployMetrics(t *testing.T) map[string]string {
	t.Helper()
	used := map[string]string{}
	add := func(where, expr string) {
		names, err := promqlMetrics(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s: %q uses no metric", where, expr)
		}
		for _, n := range names {
			if _, ok := used[n]; !ok {
				used[n] = where
			}
		}
	}
	queries := dashboardQueries(t)
	for _, where := range slices.Sorted(maps.Keys(queries)) {
		add("outbox-relay.json: "+where, queries[where])
	}
	for _, r := range readRules(t) {
		add("outbox-alerts.yaml: "+r.Alert, r.Expr)
	}
	return used
}

// scrapedNames returns the metric names of the samples of a Prometheus
// text exposition.
func scrapedNames(body string) map[string]bool {
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// TestDeployRulesHoldTheDocumentedAlerts: every example alert of
// docs/operating.md's Metrics section is a rule of
// deploy/prometheus/outbox-alerts.yaml, with the same expression and
// duration, in the same order, first.
func TestDeployRulesHoldTheDocumentedAlerts(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "Example alerts (PromQL):\n\n```yaml\n")
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatal("docs/operating.md: no yaml block after \"Example alerts (PromQL):\"")
	}
	var readme []alertRule
	if err := yaml.Unmarshal([]byte(block), &readme); err != nil {
		t.Fatalf("docs/operating.md's example alerts: %v", err)
	}
	rules := readRules(t)
	if len(readme) == 0 || len(rules) < len(readme) {
		t.Fatalf("%d documented alerts, %d rules; want every documented alert in the rules", len(readme), len(rules))
	}
	for i, want := range readme {
		got := rules[i]
		if got.Alert != want.Alert || got.Expr != want.Expr || got.For != want.For {
			t.Errorf("rule %d = %s: %q for %q; docs/operating.md has %s: %q for %q", i, got.Alert, got.Expr, got.For, want.Alert, want.Expr, want.For)
		}
	}
}

// TestDeployDashboardAndRulesUseExportedMetrics runs the worker on every
// database with an in-process broker, makes it produce every metric
// (rows published, a row the broker rejects and the relay parks, leases
// lapsing while its heartbeat table is gone), scrapes /metrics, and checks that every metric
// name the Grafana dashboard and the alert rules use is in the scrape, so
// that neither can rot when a metric is renamed. With the worker running,
// status is healthy and check finds nothing.
func TestDeployDashboardAndRulesUseExportedMetrics(t *testing.T) {
	used := deployMetrics(t)
	if t.Failed() {
		t.FailNow()
	}
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "dp", 4)
		broker := testenv.NewFake(t)
		topic := testenv.Unique("deploy-")
		broker.CreateTopic(t, topic, 2, nil)
		const rows = 20
		for i := range rows {
			if err := f.db.Scopes(outbox.WithConfig(f.cfg)).Create(outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%5), "v")).Error; err != nil {
				t.Fatal(err)
			}
		}
		// Partition 7 of a 2-partition topic: the broker never accepts it.
		seven := int32(7)
		if err := f.db.Scopes(outbox.WithConfig(f.cfg)).Create(&outbox.Message{Topic: topic, Key: []byte("poison"), Value: []byte("v"), Partition: &seven}).Error; err != nil {
			t.Fatal(err)
		}

		w := startInProcessWorker(t, append(f.flags[:len(f.flags):len(f.flags)],
			"-kafka-brokers", strings.Join(broker.Addrs, ","), "-listen", "127.0.0.1:0", "-log-format", "json",
			"-relay-id", "worker-deploy", "-poll-interval", "50ms", "-metrics-interval", "50ms",
			"-error-backoff", "50ms", "-park-after", "2", "-lease-duration", "2s", "-lease-renew-interval", "300ms"))
		if got := broker.ReadAll(t, topic, rows, time.Minute); len(got) != rows {
			t.Fatalf("read %d records; want %d\n%s", len(got), rows, w.logs)
		}
		var body string
		eventually(t, "the poison row parked", metricsDump{w.logs, &body}, func() bool {
			_, body = get("http://" + w.addr + "/metrics")
			return hasSample(body, "outbox_parked_messages", "1")
		})
		// Take the heartbeat table away: every acquisition and renewal
		// fails, so the leases lapse (a lease expiration); with the table
		// back the relay takes them again.
		away := f.cfg.RelaysTable + "_away"
		if err := f.db.Migrator().RenameTable(f.cfg.RelaysTable, away); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a lease expiration", metricsDump{w.logs, &body}, func() bool {
			_, body = get("http://" + w.addr + "/metrics")
			return scrapedNames(body)["outbox_lease_expirations_total"]
		})
		if err := f.db.Migrator().RenameTable(away, f.cfg.RelaysTable); err != nil {
			t.Fatal(err)
		}
		// Every metric has had its event by now; a name still missing after
		// a few more scrapes is not exported at all.
		var missing []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, body = get("http://" + w.addr + "/metrics")
			scraped := scrapedNames(body)
			missing = slices.DeleteFunc(slices.Sorted(maps.Keys(used)), func(name string) bool { return scraped[name] })
			if len(missing) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, name := range missing {
			t.Errorf("%s uses %s, which the worker does not export", used[name], name)
		}
		if len(missing) > 0 {
			t.Logf("/metrics:\n%s", outboxLines(body))
		}

		// The operator's view of the running worker: every bucket owned
		// again (on the database's clock), and no problem.
		var rep statusReport
		eventually(t, "status healthy after the takeover", w.logs, func() bool {
			code, stdout, _ := opsRun{}.run(t, f, "status", "-json", "-lease-duration", "2s")
			rep = statusReport{}
			return code == exitOK && json.Unmarshal([]byte(stdout), &rep) == nil && rep.Healthy
		})
		for _, b := range rep.Buckets {
			if b.Lease != "held" || ptrValue(b.Owner) != "worker-deploy" {
				t.Errorf("bucket %d: lease %s by %s; want held by worker-deploy", b.Bucket, b.Lease, ptrValue(b.Owner))
			}
		}
		if rep.Totals.Parked != 1 || rep.Totals.Pending != 0 {
			t.Errorf("status totals %s; want 0 pending, 1 parked", jsonOf(rep.Totals))
		}
		if code, stdout, _ := (opsRun{}).run(t, f, "check", "-lease-duration", "2s"); code != exitOK {
			t.Errorf("check against the running worker = %d\n%s", code, stdout)
		}
		w.stop(t)
	})
}

// inProcessWorker is the worker's run running in this process.
type inProcessWorker struct {
	cancel context.CancelFunc
	done   chan int
	logs   *logLines
	addr   string
}

// startInProcessWorker runs the worker (run, as main does) with args and
// no environment, and waits until it serves HTTP. It is stopped at
// cleanup if the test did not stop it.
func startInProcessWorker(t *testing.T, args []string) *inProcessWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	w := &inProcessWorker{cancel: cancel, done: make(chan int, 1), logs: &logLines{addr: make(chan string, 1)}}
	scanned := make(chan struct{})
	go func() { defer close(scanned); w.logs.scan(pr) }()
	go func() {
		code := run(ctx, args, noEnv, io.Discard, pw)
		pw.Close()
		<-scanned
		w.done <- code
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(time.Minute):
			t.Errorf("the worker did not stop within a minute")
		}
	})
	select {
	case w.addr = <-w.logs.addr:
	case code := <-w.done:
		w.done <- code
		t.Fatalf("worker exited %d before serving\n%s", code, w.logs)
	case <-time.After(time.Minute):
		t.Fatalf("worker did not log its address\n%s", w.logs)
	}
	return w
}

// stop stops the worker as SIGTERM does and requires exit code 0.
func (w *inProcessWorker) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case code := <-w.done:
		w.done <- code // for the cleanup
		if code != exitOK {
			t.Errorf("worker exit code %d after the stop; want 0\n%s", code, w.logs)
		}
	case <-time.After(time.Minute):
		t.Fatalf("worker did not stop\n%s", w.logs)
	}
}

// TestDeployMetricsAreTheDocumentedOnes: the metric names deploy/ uses are
// among docs/operating.md's metrics table (outbox_*) and their histogram
// series.
func TestDeployMetricsAreTheDocumentedOnes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range deployMetrics(t) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !strings.Contains(string(b), "| `"+base+"` |") {
			t.Errorf("%s uses %s, which is not in docs/operating.md's metrics table", where, name)
		}
	}
	if names := slices.Sorted(maps.Keys(deployMetrics(t))); !slices.Contains(names, "outbox_publish_duration_seconds_bucket") {
		t.Errorf("deploy/ has no publish duration histogram (uses %v)", names)
	}
}
