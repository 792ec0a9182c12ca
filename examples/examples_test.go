// Package examples_test builds every example program and runs those that
// need nothing external; the PostgreSQL examples run when the test
// environment provides PostgreSQL (OUTBOX_TEST_POSTGRES_DSN; CI always does).
package examples_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// programs are the example directories; each must hold a main package.
var programs = []string{"quickstart", "customstore", "twooutboxes", "dedup", "multirelay", "tracing", "readme"}

// build compiles every example into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, p := range programs {
		args = append(args, "./"+p)
	}
	out, err := exec.Command(goBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, p := range programs {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatalf("example %s was not built: %v", p, err)
		}
	}
	return dir
}

// TestExamples builds every example, then runs each one whose needs are
// met and checks that it exits 0 with its closing line.
func TestExamples(t *testing.T) {
	bin := build(t)
	type run struct {
		name    string
		program string
		env     []string
		want    []string
	}
	runs := []run{
		{"quickstart", "quickstart", nil, []string{"outbox table:            empty", "OK: every committed order arrived, no rolled-back order did."}},
		{"customstore", "customstore", nil, []string{"published orders key=order-1 value=shipped", "pending after the relay stopped: 0"}},
		{"twooutboxes", "twooutboxes", nil, []string{"topic orders   holds 3 records", "topic invoices holds 3 records"}},
		{"dedup", "dedup", nil, []string{"6 records consumed, 3 side effects"}},
		{"tracing", "tracing", nil, []string{"baggage              tenant=acme", `consumer "process orders"`, "OK: the consumer continued the writer's trace; the publish span links to the writer's span."}},
	}
	if b, ok := testenv.RealBroker(t); ok {
		// The tracing example honours KAFKA_BROKERS as the quickstart does.
		brokers := strings.Join(b.Addrs, ",")
		runs = append(runs, run{"tracing_kafka_brokers", "tracing", []string{"KAFKA_BROKERS=" + brokers}, []string{"kafka: KAFKA_BROKERS " + brokers + ", topic orders-", "OK: the consumer continued the writer's trace"}})
	}
	if dsn, ok := testenv.PostgresDSN(t); ok {
		var kafkaEnv []string
		if b, ok := testenv.RealBroker(t); ok {
			kafkaEnv = []string{"KAFKA_BROKERS=" + strings.Join(b.Addrs, ",")}
		}
		runs = append(runs,
			run{"multirelay_postgres", "multirelay", append([]string{"POSTGRES_DSN=" + dsn}, kafkaEnv...), []string{"0 missing", "OK: nothing lost"}},
			run{"quickstart_postgres", "quickstart", append([]string{"POSTGRES_DSN=" + dsn}, kafkaEnv...), []string{"database: postgres", "OK: every committed order arrived"}},
		)
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, r.program))
			cmd.Env = append(cleanEnv(), r.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v; want exit 0\nstdout:\n%s\nstderr:\n%s", r.program, err, stdout.String(), stderr.String())
			}
			for _, w := range r.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("%s output lacks %q:\n%s", r.program, w, stdout.String())
				}
			}
			if testing.Verbose() {
				t.Logf("%s output:\n%s", r.program, stdout.String())
			}
		})
	}
	// The README's example, twice on one database: each run places a new
	// order, creates its topic when missing (kfake creates none on its own),
	// prints one line once Kafka acknowledged the record, and exits 0.
	readmeBrokers := []testenv.Broker{testenv.NewFake(t)}
	if b, ok := testenv.RealBroker(t); ok {
		readmeBrokers = append(readmeBrokers, b)
	}
	for _, b := range readmeBrokers {
		t.Run("readme_twice_"+b.Name, func(t *testing.T) {
			dir := t.TempDir()
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, filepath.Join(bin, "readme"))
				cmd.Env, cmd.Dir = append(cleanEnv(), "KAFKA_BROKERS="+strings.Join(b.Addrs, ",")), dir
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); err != nil || len(lines) != 1 ||
					!strings.HasSuffix(lines[0], ": Kafka acknowledged its record on topic orders") {
					t.Fatalf("readme, run %d: %v, stdout %q; want exit 0 and one line saying Kafka acknowledged the record\nstderr:\n%s", i+1, err, stdout.String(), stderr.String())
				}
			}
		})
	}

	// The PostgreSQL example says what it needs instead of failing obscurely.
	t.Run("multirelay_without_postgres_exits_2", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(bin, "multirelay"))
		cmd.Env = cleanEnv()
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "POSTGRES_DSN") {
			t.Fatalf("multirelay without POSTGRES_DSN = exit %d (%v), %q; want exit 2 naming POSTGRES_DSN", code, err, out)
		}
	})
}

// cleanEnv is the test's environment without the examples' own variables,
// so that a developer's POSTGRES_DSN or KAFKA_BROKERS does not change what
// runs.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POSTGRES_DSN=") && !strings.HasPrefix(kv, "KAFKA_BROKERS=") {
			env = append(env, kv)
		}
	}
	return env
}
