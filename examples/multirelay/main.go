// Command multirelay shows several relay processes sharing one outbox on
// PostgreSQL: three relays (child processes of this program, started by
// re-executing it with -relay) split the buckets; while a writer keeps
// enqueueing, one relay is killed with SIGKILL (no graceful release); its
// leases expire and the survivors take its buckets over. At the end every
// committed row is on the topic (duplicates possible, losses not), the
// outbox table is empty, and the survivors stop gracefully with SIGTERM.
//
// It needs PostgreSQL; Kafka is an in-process broker (kfake) on loopback
// unless KAFKA_BROKERS is set:
//
//	POSTGRES_DSN="host=127.0.0.1 user=postgres dbname=app sslmode=disable" go run ./examples/multirelay
//
// It creates (and first drops) the tables multirelay_messages,
// multirelay_leases and multirelay_relays. Without POSTGRES_DSN it exits 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/examples/internal/infra"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

const (
	relays     = 3
	partitions = 8
	// Short leases so that the takeover after the kill takes seconds; the
	// defaults are 30s and 10s.
	leaseDuration = 2 * time.Second
	renewInterval = 500 * time.Millisecond
)

// outboxConfig is the outbox shared by the writer and the relays.
func outboxConfig() outbox.Config {
	return outbox.Config{MessagesTable: "multirelay_messages", LeasesTable: "multirelay_leases", RelaysTable: "multirelay_relays"}
}

func main() {
	relayID := flag.String("relay", "", "run as the relay with this id (used by the parent)")
	flag.Parse()
	dsn := os.Getenv("POSTGRES_DSN")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "multirelay: set POSTGRES_DSN to a PostgreSQL DSN")
		os.Exit(2)
	}
	var err error
	if *relayID != "" {
		err = runRelay(*relayID, dsn, strings.Split(os.Getenv("KAFKA_BROKERS"), ","))
	} else {
		err = runParent(dsn)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "multirelay:", err)
		os.Exit(1)
	}
}

func openDB(dsn string) (*gorm.DB, error) {
	return gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
}

// runRelay is a child: one relay until SIGTERM.
func runRelay(id, dsn string, brokers []string) error {
	cfg := outboxConfig()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := openDB(dsn)
	if err != nil {
		return err
	}
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		return err
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{
		RelayID:            id,
		LeaseDuration:      leaseDuration,
		LeaseRenewInterval: renewInterval,
		PollInterval:       100 * time.Millisecond,
		BatchSize:          50,
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// runParent prepares the tables and the broker, runs the writer and the
// relays, kills one, and checks the result.
func runParent(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := outboxConfig()
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%5.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	db, err := openDB(dsn)
	if err != nil {
		return err
	}
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		return err
	}
	if err := db.Migrator().DropTable(cfg.MessagesTableName(), cfg.LeasesTableName(), cfg.RelaysTableName()); err != nil {
		return err
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		return err
	}

	brokers, _, stopBroker, err := infra.Kafka()
	if err != nil {
		return err
	}
	defer stopBroker()
	topic := "multirelay-" + infra.RandomHex(4)
	if err := infra.CreateTopic(ctx, brokers, topic, partitions); err != nil {
		return err
	}

	// The relays: this program again, with -relay.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	children := map[string]*exec.Cmd{}
	for i := 1; i <= relays; i++ {
		id := fmt.Sprintf("relay-%d", i)
		cmd := exec.Command(self, "-relay", id)
		cmd.Env = append(os.Environ(), "KAFKA_BROKERS="+strings.Join(brokers, ","))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		children[id] = cmd
	}
	defer func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	say("started %d relay processes on one outbox (%d buckets), topic %s", relays, cfg.WithDefaults().BucketCount, topic)

	// The writer: ten rows per transaction, until told to stop.
	var written []string
	stopWriting := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				writerDone <- nil
				return
			default:
			}
			msgs := make([]*outbox.Message, 10)
			for j := range msgs {
				msgs[j] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", (i*10+j)%97), fmt.Sprintf("row-%d", i*10+j))
			}
			if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, msgs...) }); err != nil {
				writerDone <- err
				return
			}
			for _, m := range msgs {
				written = append(written, m.MessageID.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	owners := func() map[string][]int {
		var leases []outbox.BucketLease
		_ = db.Table(cfg.LeasesTableName()).Order("bucket").Find(&leases).Error
		out := map[string][]int{}
		now := time.Now().UnixMilli()
		for _, l := range leases {
			if l.Owner != nil && *l.Owner != "" && l.ExpiresAtMs > now {
				out[*l.Owner] = append(out[*l.Owner], int(l.Bucket))
			}
		}
		return out
	}
	show := func(o map[string][]int) string {
		var parts []string
		for _, id := range slices.Sorted(maps.Keys(o)) {
			parts = append(parts, fmt.Sprintf("%s %v", id, o[id]))
		}
		return strings.Join(parts, ", ")
	}
	// shared waits until n relays own every bucket, in fair shares (sizes
	// differ by at most one).
	shared := func(what string, n int) (map[string][]int, error) {
		buckets := cfg.WithDefaults().BucketCount
		for {
			o := owners()
			total, least, most := 0, buckets, 0
			for _, bs := range o {
				total += len(bs)
				least, most = min(least, len(bs)), max(most, len(bs))
			}
			if len(o) == n && total == buckets && most-least <= 1 {
				return o, nil
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: not reached; owners %s", what, show(o))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	o, err := shared("three relays share the buckets", relays)
	if err != nil {
		return err
	}
	say("ownership: %s", show(o))
	time.Sleep(time.Second) // let the writer and relays work a little
	victim := "relay-2"
	lost := o[victim]
	if err := children[victim].Process.Kill(); err != nil {
		return err
	}
	_ = children[victim].Wait()
	delete(children, victim)
	say("killed %s with SIGKILL (no lease release); it held buckets %v", victim, lost)

	o, err = shared("the survivors take over", relays-1)
	if err != nil {
		return err
	}
	say("ownership: %s (%s's buckets moved after its leases expired)", show(o), victim)

	close(stopWriting)
	if err := <-writerDone; err != nil {
		return err
	}
	if err := infra.Drained(ctx, db, cfg.MessagesTableName()); err != nil {
		return err
	}
	say("writer stopped after %d rows; the outbox table is empty", len(written))

	for id, c := range children {
		if err := c.Process.Signal(syscall.SIGTERM); err != nil {
			return err
		}
		if err := c.Wait(); err != nil {
			return fmt.Errorf("%s after SIGTERM: %w", id, err)
		}
		delete(children, id)
	}
	say("survivors stopped with SIGTERM; leases released: owners now %q", show(owners()))

	got, dups, err := readIDs(ctx, brokers, topic)
	if err != nil {
		return err
	}
	var missing int
	for _, id := range written {
		if !got[id] {
			missing++
		}
	}
	say("topic: %d distinct message ids of %d written, %d duplicates, %d missing", len(got), len(written), dups, missing)
	if missing > 0 || len(got) != len(written) {
		return errors.New("FAIL: rows were lost")
	}
	say("OK: nothing lost")
	return nil
}

// readIDs reads every partition of topic up to its end and returns the
// distinct message ids and the number of duplicate records.
func readIDs(ctx context.Context, brokers []string, topic string) (map[string]bool, int, error) {
	ids := map[string]bool{}
	dups := 0
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
		if err != nil {
			return nil, 0, err
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			return nil, 0, err
		}
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				return nil, 0, err
			}
			for _, h := range m.Headers {
				if h.Key == kafkapub.DefaultMessageIDHeader {
					if ids[string(h.Value)] {
						dups++
					}
					ids[string(h.Value)] = true
				}
			}
			if m.Offset+1 >= last {
				break
			}
		}
		r.Close()
	}
	return ids, dups, nil
}
