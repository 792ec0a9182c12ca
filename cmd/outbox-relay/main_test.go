package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// buildWorker compiles the command into a temporary directory.
func buildWorker(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "outbox-relay")
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// logLines collects a process's JSON log lines and finds the HTTP address.
type logLines struct {
	mu    sync.Mutex
	lines []string
	addr  chan string
}

func (l *logLines) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "serving /metrics") {
			l.addr <- rec.Addr
		}
	}
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// sqliteFile returns the DSN of a new SQLite file a worker and the test share.
func sqliteFile(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "outbox.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
}

// openOutboxDB opens dial with the outbox plugin and tables of cfg, until
// the test ends.
func openOutboxDB(t *testing.T, dial gorm.Dialector, cfg outbox.Config) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	useOutbox(t, db, cfg)
	return db
}

// useOutbox registers the outbox plugin of cfg on db and creates its tables.
func useOutbox(t *testing.T, db *gorm.DB, cfg outbox.Config) {
	t.Helper()
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestWorker starts the built binary against a database and a broker,
// lets it move rows to Kafka, scrapes /healthz and /metrics, stops it with
// SIGTERM and checks that it exited 0 and released its leases.
func TestWorker(t *testing.T) {
	bin := buildWorker(t)
	type target struct {
		name   string
		driver string
		dsn    func(t *testing.T) string
		broker func(t *testing.T) testenv.Broker
	}
	targets := []target{{
		name:   "sqlite_kfake",
		driver: "sqlite",
		dsn:    sqliteFile,
		broker: func(t *testing.T) testenv.Broker { return testenv.NewFake(t) },
	}}
	if dsn, ok := testenv.PostgresDSN(t); ok {
		targets = append(targets, target{
			name:   "postgres_kafka",
			driver: "postgres",
			dsn:    func(*testing.T) string { return dsn },
			broker: func(t *testing.T) testenv.Broker {
				if b, ok := testenv.RealBroker(t); ok {
					return b
				}
				return testenv.NewFake(t)
			},
		})
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			dsn := tg.dsn(t)
			var dial gorm.Dialector = sqlite.Open(dsn)
			if tg.driver == "postgres" {
				dial = postgres.Open(dsn)
			}
			cfg := outbox.Config{BucketCount: 4, MessagesTable: "worker_messages", LeasesTable: "worker_leases", RelaysTable: "worker_relays"}
			db := openOutboxDB(t, dial, cfg)
			broker := tg.broker(t)
			topic := testenv.Unique("worker-")
			broker.CreateTopic(t, topic, 4, nil)
			const rows = 200
			msgs := make([]*outbox.Message, rows)
			for i := range msgs {
				msgs[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%13), fmt.Sprintf("value-%d", i))
			}
			if err := outbox.Enqueue(db, msgs...); err != nil {
				t.Fatal(err)
			}

			w := startWorker(t, bin, []string{"-db-dsn", dsn, "-listen", "127.0.0.1:0", "-log-format", "json",
				"-poll-interval", "50ms", "-metrics-interval", "50ms", "-relay-id", "worker-under-test", "-lease-duration", "6s", "-lease-renew-interval", "1s", "-statement-timeout", "500ms"},
				"OUTBOX_DB_DRIVER="+tg.driver, // the environment is read too
				"OUTBOX_KAFKA_BROKERS="+strings.Join(broker.Addrs, ","),
				"OUTBOX_BUCKET_COUNT=4",
				"OUTBOX_MESSAGES_TABLE=worker_messages", "OUTBOX_LEASES_TABLE=worker_leases", "OUTBOX_RELAYS_TABLE=worker_relays",
			)
			logs := w.logs
			base := "http://" + w.addr

			// The rows move to Kafka and are deleted.
			got := broker.ReadAll(t, topic, rows, 60*time.Second)
			if len(got) != rows {
				t.Fatalf("read %d records from %s; want %d\n%s", len(got), topic, rows, logs)
			}
			eventually(t, "the messages table is empty", logs, func() bool {
				var n int64
				return db.Table(cfg.MessagesTableName()).Count(&n).Error == nil && n == 0
			})
			eventually(t, "/healthz is 200", logs, func() bool {
				code, _ := get(base + "/healthz")
				return code == http.StatusOK
			})
			// The metrics endpoint exposes the relay's instruments with the
			// acknowledged rows and the backlog sample.
			var body string
			eventually(t, "/metrics shows the rows acknowledged and an empty backlog", metricsDump{logs, &body}, func() bool {
				_, body = get(base + "/metrics")
				return hasSample(body, "outbox_publish_acknowledged_total", fmt.Sprint(rows)) &&
					hasSample(body, "outbox_pending_messages", "0")
			})
			for _, name := range []string{"outbox_owned_buckets", "outbox_publish_duration_seconds_bucket", "outbox_cycle_duration_seconds_bucket", "outbox_pending_available_ratio", "outbox_pending_oldest_age_seconds", "go_goroutines", "go_build_info"} {
				if !strings.Contains(body, name) {
					t.Errorf("/metrics lacks %s:\n%s", name, body)
				}
			}
			// Advice names the worker's flags, never Go options.
			if !strings.Contains(logs.String(), "set -notify-postgres-dsn") || strings.Contains(logs.String(), "relay.NewNotifier") {
				t.Errorf("the polling advice should name -notify-postgres-dsn and no Go option:\n%s", logs)
			}
			// The startup line names the build (outbox-relay version's fields).
			if !strings.Contains(logs.String(), `"go_version":"`+runtime.Version()+`"`) {
				t.Errorf("the startup log line lacks go_version:\n%s", logs)
			}
			// No otel_scope_* labels (the exporter's WithoutScopeInfo): they
			// were on every series, two of them always empty.
			if strings.Contains(body, "otel_scope_") {
				t.Errorf("/metrics carries otel_scope_* labels:\n%s", outboxLines(body))
			}
			if testing.Verbose() {
				t.Logf("/metrics excerpt:\n%s", outboxLines(body))
			}

			// The lease rows deleted under the running worker (a restore, a
			// mistaken cleanup): it recreates them, says so at WARN, owns its
			// buckets again and publishes what is committed next.
			if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil {
				t.Fatal(err)
			}
			more := make([]*outbox.Message, 20)
			for i := range more {
				more[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%13), fmt.Sprintf("after-delete-%d", i))
			}
			if err := outbox.Enqueue(db, more...); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the worker recreates the lease rows and publishes the rows committed after the delete", logs, func() bool {
				var owned, pending int64
				return db.Table(cfg.LeasesTableName()).Where("owner = ?", "worker-under-test").Count(&owned).Error == nil && owned == 4 &&
					db.Table(cfg.MessagesTableName()).Count(&pending).Error == nil && pending == 0
			})
			if got := broker.ReadAll(t, topic, rows+len(more), 60*time.Second); len(got) < rows+len(more) {
				t.Errorf("read %d records after the lease rows were deleted; want %d", len(got), rows+len(more))
			}
			if !strings.Contains(logs.String(), `"level":"WARN","msg":"lease rows were missing`) {
				t.Errorf("no WARN about the recreated lease rows:\n%s", logs)
			}

			// SIGTERM: exit 0, leases released, relay marked stopped.
			w.terminate(t)
			var leases []outbox.BucketLease
			if err := db.Table(cfg.LeasesTableName()).Find(&leases).Error; err != nil {
				t.Fatal(err)
			}
			if len(leases) != 4 {
				t.Errorf("lease rows = %d; want 4", len(leases))
			}
			for _, l := range leases {
				if l.Owner != nil && *l.Owner != "" && l.ExpiresAtMs > time.Now().UnixMilli() {
					t.Errorf("bucket %d still leased to %s until %d after SIGTERM; want released", l.Bucket, *l.Owner, l.ExpiresAtMs)
				}
			}
			var rel outbox.RelayHeartbeat
			if err := db.Table(cfg.RelaysTableName()).Where("relay_id = ?", "worker-under-test").First(&rel).Error; err != nil {
				t.Fatalf("relay row: %v", err)
			}
			if rel.StoppedAtMs == nil {
				t.Errorf("relay row stopped_at_ms = NULL after SIGTERM; want set")
			}
		})
	}
}

// workerProc is a running outbox-relay child process.
type workerProc struct {
	cmd    *exec.Cmd
	logs   *logLines
	exited chan error
	addr   string // of its HTTP server
}

// startWorker runs bin with args and extra environment, and waits until it
// serves HTTP. The process is killed at cleanup if still running.
func startWorker(t *testing.T, bin string, args []string, env ...string) *workerProc {
	t.Helper()
	w := &workerProc{cmd: exec.Command(bin, args...), logs: &logLines{addr: make(chan string, 1)}, exited: make(chan error, 1)}
	w.cmd.Env = append(os.Environ(), env...)
	stderr, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { defer close(scanned); w.logs.scan(stderr) }()
	go func() { <-scanned; w.exited <- w.cmd.Wait() }()
	t.Cleanup(func() {
		if w.cmd.ProcessState == nil {
			_ = w.cmd.Process.Kill()
		}
	})
	select {
	case w.addr = <-w.logs.addr:
	case err := <-w.exited:
		t.Fatalf("worker exited before serving: %v\n%s", err, w.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("worker did not log its address\n%s", w.logs)
	}
	return w
}

// terminate sends SIGTERM and requires exit status 0.
func (w *workerProc) terminate(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.exited:
		if err != nil {
			t.Fatalf("worker exit after SIGTERM: %v; want status 0\n%s", err, w.logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("worker did not exit after SIGTERM\n%s", w.logs)
	}
}

// TestWorkerRejectsBadConfiguration runs the binary with invalid settings:
// each prints one error line naming the setting and exits 2, before touching
// any service.
func TestWorkerRejectsBadConfiguration(t *testing.T) {
	bin := buildWorker(t)
	dsn := "file:" + filepath.Join(t.TempDir(), "never-created.db")
	base := []string{"-db-driver", "sqlite", "-db-dsn", dsn, "-kafka-brokers", "127.0.0.1:1"}
	cases := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"missing_driver", []string{"-db-dsn", dsn, "-kafka-brokers", "127.0.0.1:1"}, nil, "-db-driver is required"},
		{"unknown_driver", append(base, "-db-driver", "oracle"), nil, `-db-driver "oracle"`},
		{"missing_brokers", []string{"-db-driver", "sqlite", "-db-dsn", dsn}, nil, "-kafka-brokers is required"},
		{"unknown_flag", append(base, "-bogus"), nil, "-bogus"},
		{"negative_batch_size", append(base, "-batch-size", "-1"), nil, "-batch-size -1 is negative"},
		{"renew_not_shorter_than_lease", append(base, "-lease-renew-interval", "40s"), nil, "-lease-renew-interval 40s must be shorter than -lease-duration 30s"},
		{"bad_table_name", append(base, "-messages-table", "drop table;"), nil, "-messages-table"},
		{"bad_duration_in_environment", base, []string{"OUTBOX_POLL_INTERVAL=soon"}, `OUTBOX_POLL_INTERVAL="soon"`},
		{"unknown_sasl_mechanism", append(base, "-kafka-sasl-mechanism", "kerberos"), nil, "-kafka-sasl-mechanism"},
		{"transactional_prefix_without_transactions", append(base, "-kafka-transactional-id-prefix", "svc-"), nil, "-kafka-transactional-id-prefix goes with -kafka-transactions"},
		{"transaction_timeout_not_above_publish_timeout", append(base, "-kafka-transactions", "orders", "-kafka-transaction-timeout", "5s"), nil, "-kafka-transaction-timeout 5s is not longer than -kafka-publish-timeout 10s"},
		{"bad_log_format", append(base, "-log-format", "xml"), nil, "-log-format"},
		{"bad_notify_channel", append(base, "-notify-postgres-dsn", "host=127.0.0.1", "-notify-channel", "Orders-Outbox"), nil, "Channel"},
		{"broker_without_port", append(base, "-kafka-brokers", "nohostport"), nil, `-kafka-brokers "nohostport": "nohostport" is not host:port`},
		{"broker_list_with_empty_entry", append(base, "-kafka-brokers", "a:1,,b:2"), nil, `-kafka-brokers "a:1,,b:2": entry 2 is empty`},
		{"broker_with_bad_port", append(base, "-kafka-brokers", "a:1,b:http"), nil, `-kafka-brokers "a:1,b:http": "b:http": port must be a number from 1 to 65535`},
		{"broker_without_host", append(base, "-kafka-brokers", ":9092"), nil, `-kafka-brokers ":9092": ":9092" has no host`},
		{"brokers_only_commas", append(base, "-kafka-brokers", ","), nil, `-kafka-brokers ",": entry 1 is empty`},
		{"duration_without_unit", append(base, "-poll-interval", "5"), nil, `-poll-interval "5": a duration needs a unit: use a unit, e.g. 5s`},
		{"duration_without_unit_in_environment", base, []string{"OUTBOX_LEASE_DURATION=30"}, `OUTBOX_LEASE_DURATION="30": a duration needs a unit: use a unit, e.g. 30s`},
		{"duration_nonsense", append(base, "-error-backoff", "soon"), nil, `-error-backoff "soon": not a duration: use a number with a unit, e.g. 5s, 500ms or 2m`},
		{"boolean_nonsense", append(base, "-migrate=maybe"), nil, `-migrate "maybe": want true or false`},
		{"integer_nonsense", append(base, "-batch-size", "ten"), nil, `-batch-size "ten": not an integer`},
		{"negative_bucket_count", append(base, "-bucket-count", "-1"), nil, "-bucket-count -1: must be between 1 and 65536"},
		{"negative_statement_timeout", append(base, "-statement-timeout", "-1s"), nil, `-statement-timeout "-1s": must not be negative`},
		{"listen_without_port", append(base, "-listen", "9090"), nil, `-listen "9090": want host:port or :port`},
		{"listen_with_bad_port", append(base, "-listen", "127.0.0.1:http-alt"), nil, `-listen "127.0.0.1:http-alt": port must be a number from 0 to 65535`},
		{"malformed_mysql_dsn", append(base, "-db-driver", "mysql", "-db-dsn", "root@127.0.0.1:3306/app"), nil, `-db-dsn (mysql): default addr for network`},
		{"malformed_postgres_dsn", append(base, "-db-driver", "postgres", "-db-dsn", "host=127.0.0.1 port=notaport"), nil, "-db-dsn (postgres):"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("the worker accepted the configuration and ran\nstderr: %s", stderr.String())
			}
			code := cmd.ProcessState.ExitCode()
			if code != exitConfig {
				t.Fatalf("exit code = %d (%v); want %d\nstderr: %s", code, err, exitConfig, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "outbox-relay: ") {
				t.Errorf("stderr = %q; want one line starting with %q", msg, "outbox-relay: ")
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("stderr = %q; want it to contain %q", msg, tc.want)
			}
			if _, err := os.Stat(strings.TrimPrefix(dsn, "file:")); err == nil {
				t.Errorf("the database file was created; want no I/O before the configuration is valid")
			}
		})
	}
}

func get(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// hasSample reports whether the exposition has a sample of metric, labelled
// with the default outbox name, whose value is v.
func hasSample(body, metric, v string) bool {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, metric+"{") && strings.Contains(line, `outbox_name="outbox"`) && strings.HasSuffix(line, "} "+v) {
			return true
		}
	}
	return false
}

func outboxLines(body string) string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "outbox_") && !strings.Contains(line, "_bucket{") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// eventually polls cond until it holds, failing after a minute.
func eventually(t *testing.T, what string, logs fmt.Stringer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after a minute\n%s", what, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricsDump prints the logs and the last /metrics body on failure.
type metricsDump struct {
	logs *logLines
	body *string
}

func (m metricsDump) String() string { return m.logs.String() + "\n/metrics:\n" + *m.body }
