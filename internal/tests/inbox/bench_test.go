package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// BenchmarkHandleVsBareTransaction measures the inbox's cost per message:
// the same effect (one INSERT of a small row) committed in a bare
// transaction (db.Transaction: BEGIN, INSERT, COMMIT) and through Handle
// (BEGIN, the id's INSERT, the effect's INSERT, COMMIT), and Handle of a
// duplicate (BEGIN, the id's INSERT finding the row, ROLLBACK). The
// variants alternate message by message in a random order each round, so
// that a machine whose load changes loads them alike; each reports its
// median time per message (<variant>-ns) and the ratio to the bare
// transaction (<variant>/bare_tx). b.N is the messages per variant. The
// inbox table holds 10,000 ids before the first timed message.
//
//	go test -run '^$' -bench HandleVsBareTransaction -benchtime 2000x -count 5 ./inbox/
func BenchmarkHandleVsBareTransaction(b *testing.B) {
	for _, o := range testenv.Databases(b) {
		b.Run(o.Name, func(b *testing.B) {
			db := o.Open(b, nil)
			ib, _ := setup(b, db, inbox.Options{})
			ctx := context.Background()
			seq := 0
			effectOf := func(id string) func(tx *gorm.DB) error {
				return func(tx *gorm.DB) error { return tx.Create(&effect{MessageID: id, Note: "shipped"}).Error }
			}
			handle := func(id string) error {
				_, err := ib.Handle(ctx, "bench", record("orders", 0, int64(seq), id), effectOf(id))
				return err
			}
			// 10,000 recorded ids, 1,000 per transaction.
			for i := range 10 {
				rows := make([]inbox.ProcessedMessage, 1000)
				for j := range rows {
					rows[j] = inbox.ProcessedMessage{HandlerName: "bench", MessageID: inbox.ExactString(fmt.Sprintf("prefill-%d-%d", i, j)), ProcessedAtMs: time.Now().UnixMilli()}
				}
				if err := db.CreateInBatches(rows, 500).Error; err != nil {
					b.Fatal(err)
				}
			}
			variants := []struct {
				name string
				once func() error
			}{
				{"bare_tx", func() error {
					seq++
					return db.Transaction(effectOf(fmt.Sprintf("bare-%d", seq)))
				}},
				{"handle", func() error {
					seq++
					return handle(fmt.Sprintf("msg-%d", seq))
				}},
				{"handle_duplicate", func() error {
					seq++
					return handle("prefill-0-0")
				}},
			}
			for _, v := range variants {
				for range 50 { // warm-up: connections, statement caches
					if err := v.once(); err != nil {
						b.Fatal(err)
					}
				}
			}
			times := make([][]time.Duration, len(variants))
			b.ResetTimer()
			for range b.N {
				for _, i := range rand.Perm(len(variants)) {
					start := time.Now()
					if err := variants[i].once(); err != nil {
						b.Fatalf("%s: %v", variants[i].name, err)
					}
					times[i] = append(times[i], time.Since(start))
				}
			}
			b.StopTimer()
			med := make([]float64, len(variants))
			for i, v := range variants {
				slices.Sort(times[i])
				med[i] = float64(times[i][len(times[i])/2].Nanoseconds())
				b.ReportMetric(med[i], v.name+"-ns")
				if i > 0 {
					b.ReportMetric(med[i]/med[0], v.name+"/bare_tx")
				}
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
