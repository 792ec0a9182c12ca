package consumertest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Bench measures what an effect costs through c's consumer (fetch, Handle's
// transaction, offset commit: consumer-ns/effect) against a bare one-row
// transaction (bare-ns/effect), and their ratio (consumer/bare), on every
// database with the real broker when the environment names one.
//
//	go test -run '^$' -bench ConsumerVsBareTransaction -benchtime 1000x ./internal/tests/inbox/ ./internal/tests/inbox/franz/
func Bench(b *testing.B, c Client) {
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			br, ok := testenv.RealBroker(b)
			if !ok {
				br = testenv.NewFake(b)
			}
			db := o.Open(b, nil)
			ib, _ := setup(b, db, inbox.Options{Logger: slog.New(slog.DiscardHandler)})
			topic, group := newTopic(b, br, "inbox-bench-", 1), testenv.Unique("g-")
			msgs := make([]kafka.Message, b.N)
			for i := range msgs {
				msgs[i] = withID(0, fmt.Sprintf("bench-%d", i), "shipped")
			}
			for i := 0; i < len(msgs); i += 1000 {
				Produce(b, br, topic, msgs[i:min(i+1000, len(msgs))]...)
			}
			ctx := context.Background()

			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					return tx.Create(&effect{MessageID: fmt.Sprintf("bare-%d", i), Note: "shipped"}).Error
				}); err != nil {
					b.Fatal(err)
				}
			}
			bare := time.Since(start)

			start = time.Now()
			stop := runConsumer(b, c.New(b, br, ib, group, topic, "bench", applyRecord, inbox.ConsumerOptions{}))
			for Committed(b, br, group, topic, 1)[0] < int64(b.N) {
				time.Sleep(5 * time.Millisecond)
			}
			consumer := time.Since(start)
			b.StopTimer()
			stop()
			if n := effects(b, db, "bench-0"); n != 1 {
				b.Fatalf("effects of bench-0 = %d; want 1", n)
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
			b.ReportMetric(per(bare), "bare-ns/effect")
			b.ReportMetric(per(consumer), "consumer-ns/effect")
			b.ReportMetric(float64(consumer)/float64(bare), "consumer/bare")
			b.ReportMetric(0, "ns/op")
		})
	}
}
