package main

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
)

// TestWorkerWakesOnWritersNotifications: a worker started with
// -notify-postgres-dsn and polling at an hour publishes a row committed by a
// separate writer (its plugin notifying a pgnotify.Sender) at once: only the
// LISTEN/NOTIFY hint can have woken it.
func TestWorkerWakesOnWritersNotifications(t *testing.T) {
	dsn, ok := testenv.PostgresDSN(t)
	if !ok {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	}
	bin := buildWorker(t)
	broker := testenv.NewFake(t)
	topic := testenv.Unique("notify-")
	broker.CreateTopic(t, topic, 4, nil)
	channel := testenv.Unique("outbox_")

	writer, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(writer) })
	tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	sender := tr.NewSender(pgnotify.SenderOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan error, 1)
	go func() { sent <- sender.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-sent; err != nil {
			t.Errorf("Sender.Run = %v; want nil after the stop", err)
		}
	})
	if err := writer.Use(outbox.Plugin{Notifier: sender}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(writer, outbox.Config{}); err != nil {
		t.Fatal(err)
	}

	w := startWorker(t, bin, []string{"-db-driver", "postgres", "-db-dsn", dsn, "-kafka-brokers", strings.Join(broker.Addrs, ","),
		"-listen", "127.0.0.1:0", "-log-format", "json", "-poll-interval", "1h",
		"-notify-postgres-dsn", dsn, "-notify-channel", channel})
	logs, addr := w.logs, w.addr
	// Its first cycle (acquisition and discovery) is done and it listens.
	eventually(t, "/healthz is 200", logs, func() bool {
		code, _ := get("http://" + addr + "/healthz")
		return code == http.StatusOK
	})
	eventually(t, "the worker LISTENs", logs, func() bool {
		var n int
		return writer.Raw("SELECT count(*) FROM pg_stat_activity WHERE query LIKE ?", "LISTEN%"+channel+"%").Scan(&n).Error == nil && n >= 1
	})

	m := outbox.NewStringMessage(topic, "k", "woken by NOTIFY")
	if err := writer.Create(m).Error; err != nil {
		t.Fatal(err)
	}
	got := broker.ReadAll(t, topic, 1, 30*time.Second)
	if len(got) != 1 || string(got[0].Value) != "woken by NOTIFY" {
		t.Fatalf("read %d records; want the row committed by the writer (polling is at an hour)\n%s", len(got), logs)
	}

	w.terminate(t)
}

// TestWorkerRefusesANotifyDSNThroughATransactionPooler: LISTEN through
// PgBouncer in transaction mode never delivers; the worker exits 1 at start
// saying so, instead of restarting its listener forever.
func TestWorkerRefusesANotifyDSNThroughATransactionPooler(t *testing.T) {
	dsn, _, ok := testenv.PgBouncerDSN(t)
	if !ok {
		t.Skip("OUTBOX_TEST_PGBOUNCER_DSN not set")
	}
	var out, errOut bytes.Buffer
	args := []string{"-db-driver", "sqlite", "-db-dsn", filepath.Join(t.TempDir(), "w.db"), "-migrate",
		"-kafka-brokers", "127.0.0.1:1", "-listen", "", "-notify-postgres-dsn", dsn, "-notify-channel", testenv.Unique("outbox_")}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if code := run(ctx, args, func(string) string { return "" }, &out, &errOut); code != exitFailure {
		t.Fatalf("worker with -notify-postgres-dsn through PgBouncer exited %d; want %d\nstdout: %s\nstderr: %s", code, exitFailure, out.String(), errOut.String())
	}
	if logs := out.String() + errOut.String(); !strings.Contains(logs, "transaction") || !strings.Contains(logs, "notify-postgres-dsn") {
		t.Fatalf("worker output does not name the flag and the pooling mode:\n%s", logs)
	}
}
