package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/cmd/internal/chaos"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

const pgBin = "/usr/lib/postgresql/15/bin"

// syncBuffer is a log sink shared by the relay's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// outageRig is one relay (in process, real clock, short leases) on db and
// an in-process broker, with an independent consumer.
type outageRig struct {
	db       *gorm.DB
	fake     *kfake.Cluster
	topic    string
	consumer *chaos.Consumer
	logs     *syncBuffer
	perKey   map[string][]string
	all      []string
	stop     func()
}

func startRig(t *testing.T, db *gorm.DB) *outageRig {
	t.Helper()
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	r := &outageRig{db: db, fake: fake, topic: "outage", logs: &syncBuffer{}, perKey: map[string][]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	if err := chaos.CreateTopic(ctx, fake.ListenAddrs(), r.topic, 8); err != nil {
		t.Fatal(err)
	}
	r.consumer = chaos.StartConsumer(ctx, fake.ListenAddrs(), r.topic, 8)
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: fake.ListenAddrs(), Configure: func(w *kafka.Writer) {
		w.MaxAttempts, w.WriteTimeout, w.ReadTimeout = 3, 3*time.Second, 3*time.Second
	}})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(store, pub, relay.Options{
		LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second, PollInterval: 200 * time.Millisecond,
		ErrorBackoff: 250 * time.Millisecond, BatchSize: 100,
		Logger: slog.New(slog.NewTextHandler(r.logs, nil)), SingleWriter: db.Dialector.Name() == "sqlite",
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	r.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v; want nil after a stop", err)
		}
		pub.Close()
		r.consumer.Wait()
	}
	return r
}

// enqueue writes n messages, retrying while the database is down.
func (r *outageRig) enqueue(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; i += 50 {
		var msgs []*outbox.Message
		for j := i; j < min(i+50, n); j++ {
			msgs = append(msgs, outbox.NewStringMessage(r.topic, fmt.Sprintf("k%d", j%20), fmt.Sprint(j)))
		}
		for {
			err := r.db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, msgs...) })
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("enqueue: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, m := range msgs {
			r.perKey[string(m.Key)] = append(r.perKey[string(m.Key)], m.MessageID.String())
			r.all = append(r.all, m.MessageID.String())
		}
	}
}

// waitRecords waits until the consumer read at least n records.
func (r *outageRig) waitRecords(t *testing.T, n int) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, _, total := r.consumer.Snapshot(); total >= n {
			return
		}
	}
	t.Fatalf("fewer than %d records after 60s", n)
}

// finish waits for every message and the drained table, then checks.
func (r *outageRig) finish(t *testing.T, wantLogs ...string) {
	t.Helper()
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		var n int64
		if err := r.db.Model(&outbox.Message{}).Count(&n).Error; err == nil && n == 0 && r.consumer.Has(r.all) {
			break
		}
	}
	r.stop()
	ck := r.consumer.Verify(r.perKey, nil, nil, nil)
	t.Logf("messages=%d lost=%d duplicates=%d order_violations=%d", len(r.all), ck.Lost, ck.Duplicates, ck.OrderViolations)
	if ck.Lost != 0 || ck.OrderViolations != 0 {
		t.Errorf("lost %d, order violations %d; want 0 and 0", ck.Lost, ck.OrderViolations)
	}
	if logs := r.logs.String(); !slices.ContainsFunc(wantLogs, func(w string) bool { return strings.Contains(logs, w) }) {
		t.Errorf("relay logs lack any of %q:\n%s", wantLogs, logs)
	}
	checkNothingParked(t, r.db, r.logs.String())
}

// checkNothingParked fails t when an outage parked a row: transient
// failures (a broker or database down) must never park.
func checkNothingParked(t *testing.T, db *gorm.DB, logs string) {
	t.Helper()
	var parked int64
	if err := db.Model(&outbox.Message{}).Where("parked_at_ms IS NOT NULL").Count(&parked).Error; err != nil {
		t.Errorf("count parked rows: %v", err)
	}
	if parked != 0 || strings.Contains(logs, "row parked") {
		t.Errorf("the outage parked rows (%d in the table); want none: only rows the broker rejects as stored are parked", parked)
	}
}

// storeBackoffLogs are the lines of a relay backing off from a failing
// database: a relay-wide statement, or the discovery (the relay then serves
// the buckets it knows to be ready).
var storeBackoffLogs = []string{"store error; backing off", "discovery of pending buckets failed"}

// TestRelayRecoversFromDatabaseOutage stops a private PostgreSQL server in
// the middle of a run (immediate shutdown), restarts it after longer than
// the lease, and checks that the relay logged, backed off, recovered on its
// own and lost nothing.
func TestRelayRecoversFromDatabaseOutage(t *testing.T) {
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	pg := startPrivatePostgres(t)
	db, err := chaos.Open(chaos.Postgres, pg.dsn, "outage-test", 4)
	if err != nil {
		t.Fatal(err)
	}
	r := startRig(t, db)
	r.enqueue(t, 3000)
	r.waitRecords(t, 300)
	pg.ctl(t, "stop", "-m", "immediate")
	time.Sleep(4 * time.Second)
	pg.ctl(t, "start", "-w")
	r.enqueue(t, 1000)
	r.finish(t, storeBackoffLogs...)
}

// TestRelayRecoversFromBrokerOutage makes the in-process broker drop every
// connection for 5 seconds (longer than the lease) in the middle of a run
// and checks that the relay logged the failures, recovered on its own and
// lost nothing.
func TestRelayRecoversFromBrokerOutage(t *testing.T) {
	if v := os.Getenv(EnvChaos); v == "" || v == "0" {
		t.Skipf("set %s=1 to run the reliability harness", EnvChaos)
	}
	r := startRig(t, freshDB(t, "outage-test"))
	var down atomic.Bool
	r.fake.ControlKey(-1, func(kmsg.Request) (kmsg.Response, error, bool) {
		r.fake.KeepControl()
		if down.Load() {
			return nil, errors.New("outage"), true
		}
		return nil, nil, false
	})
	r.enqueue(t, 3000)
	r.waitRecords(t, 300)
	down.Store(true)
	r.enqueue(t, 500)
	time.Sleep(5 * time.Second)
	down.Store(false)
	r.enqueue(t, 500)
	r.finish(t, "publish failed")
}

// freshDB opens a fresh database of setupDB's kind, dropped when the test
// ends, as the application name app.
func freshDB(t *testing.T, app string) *gorm.DB {
	t.Helper()
	dialect, dsn := setupDB(t)
	d, err := chaos.CreateDatabase(context.Background(), dialect, dsn, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Drop(context.Background()) })
	db, err := chaos.Open(dialect, d.DSN, app, 4)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// setupDB is setup without the child binary: PostgreSQL when named
// (required under OUTBOX_TEST_REQUIRE_ALL), else SQLite.
func setupDB(t *testing.T) (dialect, dsn string) {
	t.Helper()
	if v := os.Getenv(testenv.EnvPostgres); v != "" {
		return chaos.Postgres, v
	} else if testenv.RequireAll() {
		t.Fatalf("%s is not set and %s=1", testenv.EnvPostgres, testenv.EnvRequireAll)
	}
	return chaos.SQLite, "-"
}

type privatePostgres struct {
	dir, dsn string
	port     int
}

// startPrivatePostgres initialises and starts a throwaway PostgreSQL server
// (run as the postgres OS user) on a free port; it is stopped at cleanup.
func startPrivatePostgres(t *testing.T) *privatePostgres {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin, "pg_ctl")); err != nil {
		t.Skipf("no PostgreSQL binaries in %s", pgBin)
	}
	dir, err := os.MkdirTemp("", "outbox-pg-outage-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p := &privatePostgres{dir: dir, port: port, dsn: fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", port)}
	if out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run(filepath.Join(pgBin, "initdb"), "-D", filepath.Join(dir, "data"), "--auth=trust", "-U", "postgres")
	p.ctl(t, "start", "-w")
	t.Cleanup(func() {
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pgBin, "pg_ctl"), "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate").Run()
	})
	return p
}

func (p *privatePostgres) ctl(t *testing.T, args ...string) {
	t.Helper()
	all := []string{"-u", "postgres", "--", filepath.Join(pgBin, "pg_ctl"), "-D", filepath.Join(p.dir, "data"), "-l", filepath.Join(p.dir, "log"),
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", p.port, p.dir)}
	cmd := exec.Command("runuser", append(all, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl %v: %v\n%s", args, err, out)
	}
}
