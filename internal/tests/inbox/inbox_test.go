package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

func TestHandle(t *testing.T) {
	forEachDB(t, func(t *testing.T, o testenv.Opener, db *gorm.DB) {
		ctx := withTimeout(t, time.Minute)

		t.Run("the_same_record_delivered_three_times_has_one_effect", func(t *testing.T) {
			ib, reader := setup(t, db, inbox.Options{})
			m := record("orders", 0, 7, "3f1d6a52-0e4b-4f0e-9a43-5b1a3c2d4e01")
			var outs []inbox.Outcome
			for range 3 {
				out, err := ib.Handle(ctx, "shipping", m, apply("3f1d6a52-0e4b-4f0e-9a43-5b1a3c2d4e01"))
				if err != nil {
					t.Fatalf("Handle = %v; want nil", err)
				}
				outs = append(outs, out)
			}
			if outs[0] != inbox.Processed || outs[1] != inbox.Duplicate || outs[2] != inbox.Duplicate {
				t.Fatalf("outcomes = %v; want processed, duplicate, duplicate", outs)
			}
			if n := effects(t, db, "3f1d6a52-0e4b-4f0e-9a43-5b1a3c2d4e01"); n != 1 {
				t.Fatalf("effects = %d; want 1", n)
			}
			collect(t, reader).Check(t, readings{inbox.MetricProcessed: 1, inbox.MetricDuplicates: 2, inbox.MetricFailures: 0, inbox.MetricHandleDuration: 3})
		})

		t.Run("handlers_record_one_message_independently", func(t *testing.T) {
			ib, _ := setup(t, db, inbox.Options{})
			m := record("orders", 0, 8, "shared-id")
			for _, c := range []struct {
				handler string
				want    inbox.Outcome
			}{{"billing", inbox.Processed}, {"shipping", inbox.Processed}, {"billing", inbox.Duplicate}} {
				if out, err := ib.Handle(ctx, c.handler, m, apply("shared-id")); err != nil || out != c.want {
					t.Fatalf("Handle(%s) = %v, %v; want %v", c.handler, out, err, c.want)
				}
			}
			if n := effects(t, db, "shared-id"); n != 2 {
				t.Fatalf("effects = %d; want 2 (one per handler)", n)
			}
		})

		t.Run("ids_that_differ_only_in_case_or_trailing_space_are_distinct", func(t *testing.T) {
			ib, _ := setup(t, db, inbox.Options{})
			for i, id := range []string{"Order-1", "order-1", "order-1 "} {
				out, err := ib.Handle(ctx, "case", record("orders", 0, int64(i), id), apply("case:"+id))
				if err != nil || out != inbox.Processed {
					t.Fatalf("Handle(%q) = %v, %v; want processed", id, out, err)
				}
			}
		})

		t.Run("a_handler_error_rolls_back_and_a_retry_processes", func(t *testing.T) {
			ib, reader := setup(t, db, inbox.Options{})
			m := record("orders", 1, 3, "retry-me")
			boom := errors.New("downstream unavailable")
			out, err := ib.Handle(ctx, "shipping", m, func(tx *gorm.DB) error {
				if err := apply("retry-me")(tx); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) || out != 0 {
				t.Fatalf("Handle = %v, %v; want 0 and an error wrapping %v", out, err, boom)
			}
			if !strings.Contains(err.Error(), "inbox: handler shipping: message retry-me: ") {
				t.Errorf("error %q lacks its context", err)
			}
			if n := effects(t, db, "retry-me"); n != 0 {
				t.Fatalf("effects after the failure = %d; want 0 (rolled back)", n)
			}
			out, err = ib.Handle(ctx, "shipping", m, apply("retry-me"))
			if err != nil || out != inbox.Processed {
				t.Fatalf("Handle again = %v, %v; want processed", out, err)
			}
			if n := effects(t, db, "retry-me"); n != 1 {
				t.Fatalf("effects = %d; want 1", n)
			}
			collect(t, reader).Check(t, readings{inbox.MetricProcessed: 1, inbox.MetricFailures: 1})
		})

		t.Run("a_panic_rolls_back", func(t *testing.T) {
			ib, _ := setup(t, db, inbox.Options{})
			m := record("orders", 1, 4, "panics")
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("Handle did not propagate the panic")
					}
				}()
				_, _ = ib.Handle(ctx, "shipping", m, func(tx *gorm.DB) error {
					_ = apply("panics")(tx)
					panic("handler bug")
				})
			}()
			if out, err := ib.Handle(ctx, "shipping", m, apply("panics")); err != nil || out != inbox.Processed {
				t.Fatalf("Handle after the panic = %v, %v; want processed", out, err)
			}
			if n := effects(t, db, "panics"); n != 1 {
				t.Fatalf("effects = %d; want 1", n)
			}
		})

		t.Run("a_record_without_the_header_is_an_error_by_default", func(t *testing.T) {
			ib, reader := setup(t, db, inbox.Options{})
			called := false
			before := recorded(t, db)
			for _, m := range []kafka.Message{
				record("orders", 2, 9, ""),
				{Topic: "orders", Headers: []kafka.Header{{Key: kafkapub.DefaultMessageIDHeader}}},
			} {
				out, err := ib.Handle(ctx, "shipping", m, func(*gorm.DB) error { called = true; return nil })
				if !errors.Is(err, inbox.ErrNoMessageID) || out != 0 {
					t.Fatalf("Handle = %v, %v; want an error wrapping ErrNoMessageID", out, err)
				}
			}
			if called || recorded(t, db) != before {
				t.Fatal("a record without an id ran the handler or was recorded")
			}
			collect(t, reader).Check(t, readings{inbox.MetricFailures: 2})
		})

		t.Run("IDFromOffset_derives_topic_partition_offset", func(t *testing.T) {
			ib, _ := setup(t, db, inbox.Options{IDFromOffset: true})
			m := record("orders", 2, 1234, "")
			if id, err := ib.MessageID(m); err != nil || id != "orders/2/1234" {
				t.Fatalf("MessageID = %q, %v; want orders/2/1234", id, err)
			}
			for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				if out, err := ib.Handle(ctx, "shipping", m, apply("orders/2/1234")); err != nil || out != want {
					t.Fatalf("delivery %d: Handle = %v, %v; want %v", i, out, err, want)
				}
			}
			if id, _ := ib.MessageID(record("orders", 2, 1234, "from-header")); id != "from-header" {
				t.Fatalf("MessageID with a header = %q; want the header's", id)
			}
		})

		t.Run("unusable_ids_and_handler_names_are_errors", func(t *testing.T) {
			ib, _ := setup(t, db, inbox.Options{})
			for _, id := range []string{strings.Repeat("x", inbox.MaxMessageIDLength+1), "bad\xff", "nul\x00"} {
				if _, err := ib.Handle(ctx, "shipping", record("orders", 0, 1, id), apply(id)); !errors.Is(err, inbox.ErrInvalidMessageID) {
					t.Errorf("Handle(id %q) = %v; want ErrInvalidMessageID", id, err)
				}
			}
			long := strings.Repeat("x", inbox.MaxMessageIDLength)
			if out, err := ib.Handle(ctx, "shipping", record("orders", 0, 1, long), apply("long")); err != nil || out != inbox.Processed {
				t.Errorf("Handle(id of %d bytes) = %v, %v; want processed", len(long), out, err)
			}
			for _, h := range []string{"", strings.Repeat("h", inbox.MaxHandlerLength+1)} {
				if _, err := ib.Handle(ctx, h, record("orders", 0, 1, "id"), apply("id")); err == nil {
					t.Errorf("Handle(handler of %d bytes) = nil; want an error", len(h))
				}
			}
		})

		t.Run("a_custom_table_and_header", func(t *testing.T) {
			cfg := inbox.Config{Table: "consumer_seen"}
			ib, _ := setup(t, db, inbox.Options{Config: cfg, MessageIDHeader: "event-id"})
			m := kafka.Message{Topic: "orders", Headers: []kafka.Header{{Key: "event-id", Value: []byte("e-1")}}}
			for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				if out, err := ib.Handle(ctx, "shipping", m, apply("e-1")); err != nil || out != want {
					t.Fatalf("Handle = %v, %v; want %v", out, err, want)
				}
			}
			var n int64
			if err := db.Table("consumer_seen").Count(&n).Error; err != nil || n != 1 {
				t.Fatalf("rows in consumer_seen = %d, %v; want 1", n, err)
			}
		})

		t.Run("a_cancelled_context_fails_and_records_nothing", func(t *testing.T) {
			ib, reader := setup(t, db, inbox.Options{})
			cctx, cancel := context.WithCancel(ctx)
			before := recorded(t, db)
			_, err := ib.Handle(cctx, "shipping", record("orders", 0, 1, "cancelled"), func(tx *gorm.DB) error {
				cancel()
				return apply("cancelled")(tx)
			})
			if err == nil {
				t.Fatal("Handle with a cancelled context = nil; want an error")
			}
			if recorded(t, db) != before || effects(t, db, "cancelled") != 0 {
				t.Fatal("a cancelled Handle left rows behind")
			}
			collect(t, reader).Check(t, readings{inbox.MetricFailures: 0, inbox.MetricProcessed: 0})
		})
	})
}

// TestConcurrentDeliveriesOfOneIDHaveOneEffect races deliveries of the
// same ids from several goroutines on their own connections: the first
// transaction to record an id holds it while its handler runs (until every
// other delivery of the id has started), the others wait on the row and
// then see a duplicate: exactly one effect per id, no error.
func TestConcurrentDeliveriesOfOneIDHaveOneEffect(t *testing.T) {
	forEachDB(t, func(t *testing.T, o testenv.Opener, db *gorm.DB) {
		ctx := withTimeout(t, 2*time.Minute)
		ib, reader := setup(t, db, inbox.Options{})
		const ids, racers = 10, 4
		racedOnce := false
		for i := range ids {
			id := uniqueID("race", i)
			var (
				started sync.WaitGroup
				wg      sync.WaitGroup
				mu      sync.Mutex
				outs    = map[inbox.Outcome]int{}
				errs    []error
				waited  bool // a duplicate waited for the winner's commit
				start   = make(chan struct{})
			)
			started.Add(racers)
			for r := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					started.Done()
					t0 := time.Now()
					out, err := ib.Handle(ctx, "race", record("orders", r, int64(i), id), func(tx *gorm.DB) error {
						// The winner holds the id until every racer has
						// started, and a little longer, so that they
						// meet its uncommitted row.
						started.Wait()
						time.Sleep(20 * time.Millisecond)
						return apply(id)(tx)
					})
					mu.Lock()
					defer mu.Unlock()
					outs[out]++
					if out == inbox.Duplicate && time.Since(t0) >= 10*time.Millisecond {
						waited = true
					}
					if err != nil {
						errs = append(errs, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("id %s: Handle errors %v; want none (the losers see duplicates)", id, errs)
			}
			if outs[inbox.Processed] != 1 || outs[inbox.Duplicate] != racers-1 {
				t.Fatalf("id %s: outcomes %v; want 1 processed and %d duplicates", id, outs, racers-1)
			}
			if n := effects(t, db, id); n != 1 {
				t.Fatalf("id %s: effects = %d; want 1", id, n)
			}
			racedOnce = racedOnce || waited
		}
		if !racedOnce {
			t.Fatal("no duplicate delivery ever waited for its winner: the deliveries did not overlap")
		}
		collect(t, reader).Check(t, readings{inbox.MetricProcessed: ids, inbox.MetricDuplicates: ids * (racers - 1), inbox.MetricFailures: 0})
	})
}
