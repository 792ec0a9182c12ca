package pgnotify_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// stampPublisher acknowledges everything and records when each message id
// was published.
type stampPublisher struct {
	mu   sync.Mutex
	seen map[outbox.UUID]time.Time
	ch   chan struct{}
}

func (p *stampPublisher) Publish(_ context.Context, batches [][]*outbox.Message) []relay.Result {
	now := time.Now()
	results := make([]relay.Result, len(batches))
	p.mu.Lock()
	for i, batch := range batches {
		for _, m := range batch {
			p.seen[m.MessageID] = now
		}
		results[i].Acknowledged = len(batch)
	}
	p.mu.Unlock()
	select {
	case p.ch <- struct{}{}:
	default:
	}
	return results
}

func (p *stampPublisher) OwnedBuckets([]int) {}

// BenchmarkCrossPodLatency measures commit → publish latency when the
// committing pod does not own the bucket: through LISTEN/NOTIFY, and by
// polling alone at the default one-second interval. Real clock; run with
//
//	go test -run XXX -bench CrossPodLatency -benchtime 50x ./internal/tests/pgnotify/
func BenchmarkCrossPodLatency(b *testing.B) {
	for _, mode := range []string{"listen_notify", "polling_1s"} {
		b.Run(mode, func(b *testing.B) {
			dsn, ok := testenv.PostgresDSN(b)
			if !ok {
				b.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
			}
			channel := testenv.Unique("bench_")
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			open := func(id string) (*gorm.DB, *stampPublisher) {
				db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
				if err != nil {
					b.Fatal(err)
				}
				n := relay.NewNotifier()
				if err := db.Use(outbox.Plugin{Notifier: n}); err != nil {
					b.Fatal(err)
				}
				if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
					b.Fatal(err)
				}
				store, err := gormstore.New(db, gormstore.Options{})
				if err != nil {
					b.Fatal(err)
				}
				opts := relay.Options{RelayID: id, Notifier: n, LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second, Logger: slog.New(slog.DiscardHandler)}
				if mode == "listen_notify" {
					tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: channel})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { tr.Close() })
					opts.HintTransport = tr
				}
				pub := &stampPublisher{seen: map[outbox.UUID]time.Time{}, ch: make(chan struct{}, 1)}
				r, err := relay.New(store, pub, opts)
				if err != nil {
					b.Fatal(err)
				}
				wg.Add(1)
				go func() { defer wg.Done(); _ = r.Run(ctx) }()
				return db, pub
			}
			dbA, _ := open("pod-a")
			_, pubB := open("pod-b")
			var bBucket int32 = -1
			for deadline := time.Now().Add(30 * time.Second); bBucket < 0; {
				var ls []outbox.BucketLease
				dbA.Find(&ls)
				for _, l := range ls {
					if l.Owner != nil && *l.Owner == "pod-b" && l.ExpiresAtMs > time.Now().UnixMilli() {
						bBucket = l.Bucket
					}
				}
				if time.Now().After(deadline) {
					b.Fatal("pod-b never owned a bucket")
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(2 * time.Second) // let rebalancing settle
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// Commits arrive at random points of the poll cycle.
				b.StopTimer()
				time.Sleep(rand.N(time.Second))
				b.StartTimer()
				m := &outbox.Message{Topic: "orders", Partition: &bBucket, Value: []byte("x")}
				start := time.Now()
				if err := dbA.Create(m).Error; err != nil {
					b.Fatal(err)
				}
				for {
					pubB.mu.Lock()
					at, ok := pubB.seen[m.MessageID]
					pubB.mu.Unlock()
					if ok {
						lat = append(lat, at.Sub(start))
						break
					}
					select {
					case <-pubB.ch:
					case <-time.After(5 * time.Second):
						b.Fatalf("message %d not published by pod-b within 5s", i)
					}
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
		})
	}
}
