// Command quickstart shows the transactional outbox from top to bottom in one
// program: it opens a database, registers the outbox plugin, starts a relay
// that publishes to Kafka, places a few hundred orders (each order row and its
// Kafka record in one transaction, some transactions deliberately rolled
// back), consumes the topic deduplicating on the message-id header, and
// prints a short summary.
//
// It needs nothing but Go:
//
//	go run ./examples/quickstart
//
// By default it uses a SQLite file in a temporary directory and an in-process
// Kafka broker (kfake) listening on loopback. Two environment variables swap
// in real services:
//
//	KAFKA_BROKERS  comma-separated bootstrap addresses of a real Kafka cluster
//	               (the quickstart creates a fresh topic quickstart-orders-<random>)
//	POSTGRES_DSN   a PostgreSQL DSN, e.g. "host=127.0.0.1 user=postgres dbname=app sslmode=disable"
//	               (the quickstart drops and recreates its own quickstart_* tables)
//
// It exits 0 only if every committed order arrived, no rolled-back order did,
// and the outbox table is empty at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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
	orderCount  = 300 // orders placed
	writers     = 4   // concurrent writers
	rollbackOne = 7   // every 7th transaction is rolled back
	partitions  = 8
)

// Order is the business row written together with its outbox message.
type Order struct {
	ID        string `gorm:"primaryKey;size:36"`
	Customer  string `gorm:"size:64;not null"`
	Cents     int64  `gorm:"not null"`
	CreatedAt time.Time
}

// TableName keeps the quickstart's tables apart from anything else.
func (Order) TableName() string { return "quickstart_orders" }

// OrderPlaced is the event the service publishes.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// errDeliberateRollback makes a transaction roll back on purpose.
var errDeliberateRollback = errors.New("quickstart: deliberate rollback")

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// 1. The database.
	db, dbDesc, cleanup, err := openDB()
	if err != nil {
		return err
	}
	defer cleanup()

	// 2. One outbox configuration, shared by the plugin (writers) and the
	// store (relay). The zero Config means 8 buckets and the tables
	// outbox_messages, outbox_leases, outbox_relays; the quickstart names its
	// own so that it can drop them safely.
	cfg := outbox.Config{
		MessagesTable: "quickstart_outbox_messages",
		LeasesTable:   "quickstart_outbox_leases",
		RelaysTable:   "quickstart_outbox_relays",
	}

	// 3. The relay's notifier exists before the relay, so the plugin can be
	// registered right after gorm.Open: every commit that writes outbox
	// rows wakes the relay at once instead of waiting for its next poll.
	notifier := relay.NewNotifier()
	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier, Logger: log}); err != nil {
		return err
	}
	m := db.Migrator()
	if err := m.DropTable(&Order{}, cfg.MessagesTableName(), cfg.LeasesTableName(), cfg.RelaysTableName()); err != nil {
		return fmt.Errorf("drop old quickstart tables: %w", err)
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}

	// 4. Kafka: a real cluster or an in-process broker, and a fresh topic.
	brokers, brokerDesc, stopBroker, err := infra.Kafka()
	if err != nil {
		return err
	}
	defer stopBroker()
	topic := "quickstart-orders-" + infra.RandomHex(4)
	if err := infra.CreateTopic(ctx, brokers, topic, partitions); err != nil {
		return err
	}

	// 5. The relay: the GORM store, the kafka-go publisher (acks=all) and
	// the notifier given to the plugin. Metrics go to an in-memory reader
	// here; cmd/outbox-relay exports them to Prometheus.
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		return err
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer pub.Close()
	metrics := sdkmetric.NewManualReader()
	r, err := relay.New(store, pub, relay.Options{
		Notifier:      notifier,
		Logger:        log,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics)),
		SingleWriter:  db.Dialector.Name() == "sqlite",
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(relayCtx) }()
	defer func() {
		stopRelay()
		<-relayDone
	}()

	// 6. A consumer that deduplicates on the message-id header.
	c := newConsumer()
	consumeCtx, stopConsumer := context.WithCancel(ctx)
	var consumers sync.WaitGroup
	for p := range partitions {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			c.consume(consumeCtx, brokers, topic, p)
		}()
	}
	defer func() {
		stopConsumer()
		consumers.Wait()
	}()

	// 7. Place the orders: the order row and its outbox message in one
	// transaction; every 7th transaction rolls back after writing both.
	fmt.Printf("gorm-outbox quickstart\n  database: %s\n  kafka:    %s, topic %s (%d partitions)\n", dbDesc, brokerDesc, topic, partitions)
	committed, rolledBack, err := placeOrders(ctx, db, topic)
	if err != nil {
		return err
	}

	// 8. Wait until every committed order arrived and the relay deleted
	// every row it published.
	var pending int64
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := db.Table(cfg.MessagesTableName()).Count(&pending).Error; err != nil {
			pending = -1
		}
		if c.hasAll(committed) && pending == 0 {
			break
		}
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	relayDone <- nil // for the deferred receive

	// 9. The summary.
	received, dups, lat := c.result(committed)
	acked := acknowledged(ctx, metrics)
	var missing, unexpected []string
	for id := range committed {
		if !received[id] {
			missing = append(missing, id)
		}
	}
	for id := range received {
		if rolledBack[id] {
			unexpected = append(unexpected, id)
		}
	}
	fmt.Printf("  orders committed:        %d\n", len(committed))
	fmt.Printf("  orders rolled back:      %d\n", len(rolledBack))
	fmt.Printf("  records published:       %d (acknowledged by Kafka, acks=all)\n", acked)
	fmt.Printf("  orders consumed:         %d distinct\n", len(received))
	fmt.Printf("  duplicates dropped:      %d\n", dups)
	fmt.Printf("  commit→consume latency:  p50 %v, p99 %v\n", percentile(lat, 50), percentile(lat, 99))
	if pending == 0 {
		fmt.Printf("  outbox table:            empty\n")
	} else {
		fmt.Printf("  outbox table:            %d rows left\n", pending)
	}
	switch {
	case len(missing) > 0:
		return fmt.Errorf("FAIL: %d committed orders never arrived (e.g. %s)", len(missing), missing[0])
	case len(unexpected) > 0:
		return fmt.Errorf("FAIL: %d rolled-back orders arrived (e.g. %s)", len(unexpected), unexpected[0])
	case pending != 0:
		return fmt.Errorf("FAIL: the outbox table still holds %d rows", pending)
	}
	fmt.Println("OK: every committed order arrived, no rolled-back order did.")
	return nil
}

// openDB opens PostgreSQL when POSTGRES_DSN is set, else a SQLite file in a
// new temporary directory.
func openDB() (db *gorm.DB, desc string, cleanup func(), err error) {
	if dsn := os.Getenv("POSTGRES_DSN"); dsn != "" {
		db, err = gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			return nil, "", nil, fmt.Errorf("open postgres: %w", err)
		}
		sqlDB, _ := db.DB()
		return db, "postgres (POSTGRES_DSN)", func() { _ = sqlDB.Close() }, nil
	}
	db, path, done, err := infra.SQLite("quickstart.db")
	if err != nil {
		return nil, "", nil, err
	}
	return db, "sqlite " + path, done, nil
}

// placeOrders writes orderCount orders from several goroutines and returns
// the commit time of every committed order and the ids of the rolled-back
// ones.
func placeOrders(ctx context.Context, db *gorm.DB, topic string) (committed map[string]time.Time, rolledBack map[string]bool, err error) {
	committed = map[string]time.Time{}
	rolledBack = map[string]bool{}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make([]error, writers)
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < orderCount; i += writers {
				order := Order{ID: outbox.NewUUID().String(), Customer: fmt.Sprintf("customer-%d", i%17), Cents: int64(1000 + i)}
				rollback := i%rollbackOne == rollbackOne-1
				err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&order).Error; err != nil {
						return err
					}
					msg, err := outbox.NewJSONMessage(topic, order.ID, OrderPlaced{OrderID: order.ID, Customer: order.Customer, Cents: order.Cents})
					if err != nil {
						return err
					}
					if err := tx.Create(msg).Error; err != nil {
						return err
					}
					if rollback {
						return errDeliberateRollback
					}
					return nil
				})
				now := time.Now()
				mu.Lock()
				switch {
				case err == nil:
					committed[order.ID] = now
				case errors.Is(err, errDeliberateRollback):
					rolledBack[order.ID] = true
				default:
					errs[w] = fmt.Errorf("place order %d: %w", i, err)
				}
				mu.Unlock()
				if errs[w] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return committed, rolledBack, errors.Join(errs...)
}

// consumer reads the topic and deduplicates on the message-id header.
type consumer struct {
	mu       sync.Mutex
	seen     map[string]bool      // message ids
	received map[string]time.Time // order id → first arrival
	dups     int
}

func newConsumer() *consumer {
	return &consumer{seen: map[string]bool{}, received: map[string]time.Time{}}
}

func (c *consumer) consume(ctx context.Context, brokers []string, topic string, partition int) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: topic, Partition: partition,
		MaxWait: 50 * time.Millisecond,
	})
	defer r.Close()
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return // ctx done
		}
		var id string
		for _, h := range m.Headers {
			if h.Key == kafkapub.DefaultMessageIDHeader {
				id = string(h.Value)
			}
		}
		now := time.Now()
		c.mu.Lock()
		if c.seen[id] {
			c.dups++ // a redelivery: the same message id was processed already
		} else {
			c.seen[id] = true
			c.received[string(m.Key)] = now
		}
		c.mu.Unlock()
	}
}

func (c *consumer) hasAll(orders map[string]time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range orders {
		if _, ok := c.received[id]; !ok {
			return false
		}
	}
	return true
}

// result returns the distinct orders received, the duplicates dropped, and
// the commit→consume latency of each committed order that arrived.
func (c *consumer) result(committed map[string]time.Time) (received map[string]bool, dups int, lat []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	received = map[string]bool{}
	for id, at := range c.received {
		received[id] = true
		if t, ok := committed[id]; ok {
			// The commit time is taken after Transaction returned, so a very
			// fast delivery can precede it by a hair.
			lat = append(lat, max(0, at.Sub(t)))
		}
	}
	return received, c.dups, lat
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p)/100)
	return s[i].Round(100 * time.Microsecond)
}

// acknowledged reads the relay's outbox.publish.acknowledged counter.
func acknowledged(ctx context.Context, reader *sdkmetric.ManualReader) int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return -1
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == relay.MetricPublishAcknowledged {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}
