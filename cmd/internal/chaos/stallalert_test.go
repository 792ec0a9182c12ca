package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
)

// stallRule is deploy/prometheus/outbox-alerts.yaml's OutboxPublishStalled,
// read from the file the operators load.
func stallRule(t *testing.T) (metric string, threshold float64, hold time.Duration) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "prometheus", "outbox-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct{ Alert, Expr, For string }
		}
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	// The shape this test evaluates; a rule of another shape must come
	// with an evaluator for it.
	shape := regexp.MustCompile(`^max by \(outbox_name\) \(([a-z_]+)\) > ([0-9.]+)$`)
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert != "OutboxPublishStalled" {
				continue
			}
			m := shape.FindStringSubmatch(strings.TrimSpace(r.Expr))
			if m == nil {
				t.Fatalf("OutboxPublishStalled's expression %q is not of the shape this test evaluates (%s)", r.Expr, shape)
			}
			threshold, _ = strconv.ParseFloat(m[2], 64)
			if hold, err = time.ParseDuration(r.For); err != nil {
				t.Fatalf("OutboxPublishStalled's for %q: %v", r.For, err)
			}
			return m[1], threshold, hold
		}
	}
	t.Fatal("no OutboxPublishStalled rule in deploy/prometheus/outbox-alerts.yaml")
	return "", 0, 0
}

// scrapeMax returns the largest sample of metric on a /metrics page, and
// whether there was one.
func scrapeMax(page, metric string) (float64, bool) {
	best, found := 0.0, false
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil && (!found || v > best) {
			best, found = v, true
		}
	}
	return best, found
}

// TestPublishStalledAlertFiresWhileTheBrokerIsPaused runs the outbox-relay
// worker binary on PostgreSQL and the real broker, freezes the broker
// (SIGSTOP of its JVM) for longer than the OutboxPublishStalled rule's
// window (threshold + for), scrapes the worker's /metrics every second
// and evaluates the rule as shipped in deploy/: it must go pending once
// the stall passes the threshold, stay pending without a break, and fire
// after its "for"; once the broker resumes every row is published and the
// alert resolves. (The in-flight age it replaced fell back to 0 at each
// failed attempt, so the rule never fired.)
func TestPublishStalledAlertFiresWhileTheBrokerIsPaused(t *testing.T) {
	broker, pid := pausableBroker(t)
	metric, threshold, hold := stallRule(t)
	dialect, base := setupDB(t)
	if dialect != chaos.Postgres {
		t.Skip("needs PostgreSQL")
	}
	d, err := chaos.CreateDatabase(context.Background(), dialect, base, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Drop(context.Background()) })
	db, err := chaos.Open(dialect, d.DSN, "stall-test", 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	topic := fmt.Sprintf("chaos-stall-%d", time.Now().UnixNano())
	broker.CreateTopic(t, topic, 4, nil)

	bin := filepath.Join(t.TempDir(), "outbox-relay")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/gorm-outbox/outbox/cmd/outbox-relay").CombinedOutput(); err != nil {
		t.Fatalf("build the worker: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-db-driver", "postgres", "-db-dsn", d.DSN, "-kafka-brokers", strings.Join(broker.Addrs, ","),
		"-listen", "127.0.0.1:0", "-log-format", "json", "-poll-interval", "100ms")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var logs []string
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logs = append(logs, line)
			logMu.Unlock()
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving /metrics and /healthz" {
				addr <- l.Addr
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	var url string
	select {
	case a := <-addr:
		url = "http://" + a + "/metrics"
	case <-time.After(time.Minute):
		t.Fatal("the worker did not serve /metrics within a minute")
	}
	scrape := func() string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// A writer commits 5 rows every 200 ms for the whole run.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			var msgs []*outbox.Message
			for j := range 5 {
				msgs = append(msgs, outbox.NewStringMessage(topic, fmt.Sprintf("k%d", j), strconv.Itoa(i)))
			}
			_ = outbox.Enqueue(db, msgs...) // a failed commit is simply not in the outbox
		}
	}()
	stopWriter := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriter)
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if v, _ := scrapeMax(scrape(), "outbox_publish_acknowledged_total"); v > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("nothing acknowledged a minute into the run, before any pause")
		}
	}

	resume := sync.OnceFunc(func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT %d: %v", pid, err)
		}
	})
	t.Cleanup(resume)
	pauseFor := time.Duration(threshold*float64(time.Second)) + hold + 15*time.Second
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	paused := time.Now()

	// Evaluate the rule every second, as Prometheus would at a 1 s
	// evaluation interval: pending while the expression holds, firing once
	// it has held for "for"; a scrape where it does not hold resets it.
	var pendingAt, firingAt time.Time
	var failureAts []time.Duration
	var lastFailures float64
	var peak float64
	breaks := 0
	for time.Since(paused) < pauseFor {
		page := scrape()
		v, found := scrapeMax(page, metric)
		if !found {
			t.Fatalf("%s is not on /metrics", metric)
		}
		peak = max(peak, v)
		if f, _ := scrapeMax(page, "outbox_publish_failures_total"); f > lastFailures {
			failureAts = append(failureAts, time.Since(paused).Round(100*time.Millisecond))
			lastFailures = f
		}
		now := time.Now()
		switch {
		case v > threshold && pendingAt.IsZero():
			pendingAt = now
		case v <= threshold && !pendingAt.IsZero() && firingAt.IsZero():
			breaks++
			pendingAt = time.Time{}
		}
		if !pendingAt.IsZero() && firingAt.IsZero() && now.Sub(pendingAt) >= hold {
			firingAt = now
		}
		time.Sleep(time.Second)
	}
	resume()
	resumed := time.Now()
	offset := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(paused).Round(100 * time.Millisecond).String()
	}

	// After the resume: the stall ends and, the writer stopped, the rows
	// drain.
	var resolvedAfter time.Duration
	for end := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if v, _ := scrapeMax(scrape(), metric); v <= threshold && resolvedAfter == 0 {
			resolvedAfter = time.Since(resumed)
			stopWriter()
		}
		var n int64
		if resolvedAfter != 0 && db.Model(&outbox.Message{}).Count(&n).Error == nil && n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("90 s after the resume: %d rows left, stall resolved after %v", n, resolvedAfter)
		}
	}
	t.Logf("rule %s > %g for %v (deploy/prometheus/outbox-alerts.yaml): broker paused at 0s for %v; pending at %s, firing at %s, %d breaks while pending; peak %s %.1fs; publish failures counted at %v; resolved %v after the resume",
		metric, threshold, hold, pauseFor, offset(pendingAt), offset(firingAt), breaks, metric, peak, failureAts, resolvedAfter.Round(100*time.Millisecond))
	// Why attempts after the first end before PublishTimeout: the errors
	// of the first failed attempts, as the worker logged them.
	logMu.Lock()
	var failed []string
	for _, line := range logs {
		var l struct{ Msg, Error string }
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "publish failed") && len(failed) < 3 {
			failed = append(failed, l.Error)
		}
	}
	logMu.Unlock()
	t.Logf("the first failed attempts' errors: %q", failed)
	if firingAt.IsZero() {
		t.Errorf("OutboxPublishStalled never fired during a %v pause (pending at %s, %d breaks, peak %.1f)", pauseFor, offset(pendingAt), breaks, peak)
	} else if latest := time.Duration(threshold*float64(time.Second)) + hold + 5*time.Second; firingAt.Sub(paused) > latest {
		t.Errorf("OutboxPublishStalled fired %s into the pause; want within %v (threshold + for + 5 s)", offset(firingAt), latest)
	}
	if breaks > 0 {
		t.Errorf("the stall signal fell to the threshold %d times while the broker stayed paused", breaks)
	}
}
