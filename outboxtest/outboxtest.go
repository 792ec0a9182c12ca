// Package outboxtest gives an adopter's tests a working outbox in one call:
// a database with the outbox tables and outbox.Plugin registered, an
// in-process Kafka broker (franz-go's kfake, on loopback), a relay
// publishing to it, and a reader of what reached a topic — all torn down
// when the test ends.
//
//	env := outboxtest.New(t, outboxtest.Options{})
//	topic := env.Topic(t, 1)
//	err := env.DB.Transaction(func(tx *gorm.DB) error {
//		// the code under test: its business rows and outbox.Enqueue(tx, …)
//	})
//	records := env.Records(t, topic, 1) // what the relay published
//
// It is a module of its own (github.com/gorm-outbox/outbox/outboxtest), so
// that the in-process broker and the test drivers stay out of the
// library's module graph: require it from your tests only.
package outboxtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Options configure New. The zero value is a SQLite database in the test's
// temporary directory with the default outbox configuration.
type Options struct {
	// Config is the outbox configuration of the plugin, the tables and the
	// relay. Zero: the defaults (8 buckets, tables outbox_*).
	Config outbox.Config
	// PostgresDSN, when set, opens PostgreSQL instead of SQLite. The outbox
	// tables are created there if missing (outbox.AutoMigrate) and left
	// in place; give each test its own database or table names
	// (Config.MessagesTable, …) when tests run in parallel.
	PostgresDSN string
	// Relay are the relay's options. Notifier is set to the plugin's
	// notifier, and PollInterval defaults to 50ms, so a commit reaches the
	// broker within milliseconds.
	Relay relay.Options
	// Broker are extra options of the in-process broker (kfake).
	Broker []kfake.Opt
}

// Env is a running outbox for one test.
type Env struct {
	// DB is the database with outbox.Plugin registered: enqueue with
	// outbox.Enqueue(tx, …) or tx.Create(&outbox.Message{…}).
	DB *gorm.DB
	// Config is the outbox configuration in use (with its defaults).
	Config outbox.Config
	// Brokers are the in-process broker's addresses.
	Brokers []string
	// Relay is the running relay.
	Relay *relay.Relay
}

// New starts an outbox for t: it opens the database, registers the plugin,
// creates the tables, starts the in-process broker and a relay, and
// registers their teardown with t.Cleanup (the relay is stopped, and its
// error, if any, fails the test). A setup failure fails the test at once.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	cfg := opts.Config.WithDefaults()
	var dial gorm.Dialector
	if opts.PostgresDSN != "" {
		dial = postgres.Open(opts.PostgresDSN)
	} else {
		path := filepath.Join(t.TempDir(), "outbox.db")
		// WAL and a busy timeout let the writers and the relay share the
		// file; immediate transactions avoid lock upgrades.
		dial = sqlite.Open("file:" + path + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate")
	}
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("outboxtest: open the database: %v", err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	notifier := relay.NewNotifier()
	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier}); err != nil {
		t.Fatalf("outboxtest: register the plugin: %v", err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatalf("outboxtest: create the outbox tables: %v", err)
	}

	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts.Broker...)...)
	if err != nil {
		t.Fatalf("outboxtest: start the in-process broker: %v", err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	ro := opts.Relay
	ro.Notifier = notifier
	ro.SingleWriter = ro.SingleWriter || opts.PostgresDSN == ""
	if ro.PollInterval == 0 {
		ro.PollInterval = 50 * time.Millisecond
	}
	r, err := relay.New(store, pub, ro)
	if err != nil {
		_ = pub.Close()
		t.Fatalf("outboxtest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { // runs before the broker's and the database's cleanups
		cancel()
		if err := <-done; err != nil {
			t.Errorf("outboxtest: the relay stopped with an error: %v", err)
		}
		_ = pub.Close()
	})
	return &Env{DB: db, Config: cfg, Brokers: brokers, Relay: r}
}

// Topic creates a topic with a unique name and the given number of
// partitions on the in-process broker, and returns its name.
func (e *Env) Topic(t testing.TB, partitions int) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "outboxtest-" + hex.EncodeToString(b)
	client := &kafka.Client{Addr: kafka.TCP(e.Brokers...), Timeout: 10 * time.Second}
	res, err := client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: name, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = res.Errors[name]
	}
	if err != nil {
		t.Fatalf("outboxtest: create topic %s: %v", name, err)
	}
	return name
}

// Records waits until at least n records are on topic (every partition,
// from the start) and returns them, ordered by partition and offset. It
// fails the test if they are not there within 30 s. Each record carries
// the message id header (kafkapub.DefaultMessageIDHeader, unless the relay
// options changed it).
func (e *Env) Records(t testing.TB, topic string, n int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := kafka.DialContext(ctx, "tcp", e.Brokers[0])
	if err != nil {
		t.Fatalf("outboxtest: dial the broker: %v", err)
	}
	parts, err := conn.ReadPartitions(topic)
	_ = conn.Close()
	if err != nil {
		t.Fatalf("outboxtest: partitions of %s: %v", topic, err)
	}
	var got []kafka.Message
	for ctx.Err() == nil {
		got = got[:0]
		for _, p := range parts {
			got = append(got, e.readPartition(ctx, topic, p.ID)...)
		}
		if len(got) >= n {
			slices.SortStableFunc(got, func(a, b kafka.Message) int {
				return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
			})
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("outboxtest: %d records on %s after 30s; want %d", len(got), topic, n)
	return nil
}

// readPartition returns the records of one partition up to its current
// end.
func (e *Env) readPartition(ctx context.Context, topic string, partition int) []kafka.Message {
	conn, err := kafka.DialLeader(ctx, "tcp", e.Brokers[0], topic, partition)
	if err != nil {
		return nil
	}
	defer conn.Close()
	last, err := conn.ReadLastOffset()
	if err != nil || last == 0 {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.Brokers, Topic: topic, Partition: partition, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	var out []kafka.Message
	for int64(len(out)) < last {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			break
		}
		out = append(out, m)
	}
	return out
}
