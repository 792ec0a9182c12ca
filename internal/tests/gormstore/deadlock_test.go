package gormstore_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// deadlockOrder is the business row a writer commits with its outbox rows.
type deadlockOrder struct {
	ID      int64 `gorm:"primaryKey;autoIncrement"`
	Payload string
}

// TestMarkPublishedDoesNotDeadlockConcurrentWriters runs writers that
// commit outbox rows while a relay reads (NextBatch) and deletes
// (MarkPublished) them, several buckets at a time as a relay does
// (relay.DefaultMaxConcurrentBuckets): neither a writer's commit nor a
// delete may fail, and every row ends deleted. Half of a writer's
// transactions commit a business row and rows spread over several buckets
// (in a random bucket order, as keys hash), the other half a single row,
// as outbox-bench's writers do.
//
// On MariaDB at its default REPEATABLE READ, once the table was small the
// optimizer ran the DELETE as a full scan of the primary key: it took
// next-key locks on every row, waited on the writers' uncommitted rows, and
// writers inserting behind those locks (or behind another bucket's delete)
// closed a cycle; both writers' commits and deletes ended as deadlock
// victims (Error 1213). The loops are bounded by iterations, not by time.
func TestMarkPublishedDoesNotDeadlockConcurrentWriters(t *testing.T) {
	const (
		buckets     = 8
		writers     = 16
		txPerWriter = 80
		rowsPerTx   = 4  // in a writer's even transactions; its odd ones write one
		batch       = 50 // NextBatch's limit
		relayLoops  = 4  // buckets read and deleted concurrently
		total       = writers * txPerWriter / 2 * (rowsPerTx + 1)
	)
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, buckets)
			orders := testenv.Unique("orders_")
			if err := db.Table(orders).AutoMigrate(&deadlockOrder{}); err != nil {
				t.Fatal(err)
			}
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.SetMaxIdleConns(writers + relayLoops) // no reconnect per statement
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			msgs := cfg.MessagesTableName()

			var writing sync.WaitGroup
			writerErrs := make(chan error, writers*txPerWriter)
			done := make(chan struct{})
			for w := range writers {
				writing.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for i := range txPerWriter {
						err := db.Transaction(func(tx *gorm.DB) error {
							rows := 1
							if i%2 == 0 {
								rows = rowsPerTx
								if err := tx.Table(orders).Create(&deadlockOrder{Payload: fmt.Sprintf("w%d-%d", w, i)}).Error; err != nil {
									return err
								}
							}
							for range rows {
								m := pendingMessage(int32(rng.IntN(buckets)))
								m.Key = fmt.Appendf(nil, "k%d", rng.IntN(100))
								if err := raw(tx).Table(msgs).Create(m).Error; err != nil {
									return err
								}
							}
							return nil
						})
						if err != nil {
							writerErrs <- fmt.Errorf("writer %d, transaction %d: %w", w, i, err)
						}
					}
				})
			}
			go func() { writing.Wait(); close(done) }()

			// The relay: relayLoops loops, each over its share of the
			// buckets, a pass per iteration while the writers write, then
			// until a pass after their end finds nothing; bounded, so that a
			// store that never drains fails.
			ctx := t.Context()
			var mu sync.Mutex
			deleted := map[int64]bool{}
			var relayErrs []error
			var relaying sync.WaitGroup
			for g := range relayLoops {
				relaying.Go(func() {
					finished := false
					for pass := 0; ; pass++ {
						if pass > 50*total/batch {
							mu.Lock()
							relayErrs = append(relayErrs, fmt.Errorf("relay loop %d: the table is not drained after %d passes", g, pass))
							mu.Unlock()
							return
						}
						select {
						case <-done:
							finished = true
						default:
						}
						found := 0
						for b := g; b < buckets; b += relayLoops {
							got, err := nextBatch(ctx, s, b, batch, 0)
							if err != nil {
								mu.Lock()
								relayErrs = append(relayErrs, fmt.Errorf("NextBatch(%d): %w", b, err))
								mu.Unlock()
								continue
							}
							found += len(got)
							err = s.MarkPublished(ctx, got)
							mu.Lock()
							if err != nil {
								relayErrs = append(relayErrs, fmt.Errorf("MarkPublished(%d, %d rows): %w", b, len(got), err))
							} else {
								for _, m := range got {
									deleted[m.ID] = true
								}
							}
							mu.Unlock()
						}
						if finished && found == 0 {
							return
						}
					}
				})
			}
			relaying.Wait()
			close(writerErrs)

			var failed []error
			for err := range writerErrs {
				failed = append(failed, err)
			}
			for i, err := range failed {
				if i < 3 {
					t.Errorf("writer's commit failed: %v", err)
				}
			}
			for i, err := range relayErrs {
				if i < 3 {
					t.Errorf("relay: %v", err)
				}
			}
			if len(failed) > 0 || len(relayErrs) > 0 {
				t.Fatalf("%d of %d writers' transactions and %d relay calls failed", len(failed), writers*txPerWriter, len(relayErrs))
			}
			if len(deleted) != total {
				t.Errorf("MarkPublished deleted %d distinct rows; want %d", len(deleted), total)
			}
			if n := count(t, db, msgs, "1 = 1"); n != 0 {
				t.Errorf("%d rows left after the drain; want 0", n)
			}
		})
	}
}
