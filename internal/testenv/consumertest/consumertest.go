// Package consumertest is the behaviour suite that every inbox consumer
// loop passes: inbox.Consumer on kafka-go and the franz-go Consumer of
// module inbox/franz. Each test file wraps its client's consumer as a
// Client and calls Run.
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// Record is a consumed record as the suite's handlers see it, whatever the
// client.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kafka.Header
}

// HandlerFunc is a suite handler: it applies r's effect in tx.
type HandlerFunc func(tx *gorm.DB, r Record) error

// Consumer is a consumer loop under test.
type Consumer interface {
	// Run consumes until ctx is done and returns nil then.
	Run(ctx context.Context) error
	// Close leaves the group (after Run returned); a second Close does
	// nothing.
	Close()
}

// Client builds the consumers of one Kafka client for the suite.
type Client struct {
	// Name names the client in failures.
	Name string

	// SkipsAborted: the client drops the records of aborted transactions
	// (franz-go reading with read_committed; kafka-go hands them over).
	SkipsAborted bool

	// New returns a consumer in group of topic on b that handles records
	// with fn under handler, recording ids in ib, with opts; it provides the
	// writer of opts.DeadLetterTopic and closes what it opens at t's cleanup.
	New func(t testing.TB, b testenv.Broker, ib *inbox.Inbox, group, topic, handler string, fn HandlerFunc, opts inbox.ConsumerOptions) Consumer
}

// Run runs the suite on every database with the in-process broker and, on
// PostgreSQL, with the real broker when the environment names one.
func Run(t *testing.T, c Client) {
	ForEachPairing(t, false, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db := o.Open(t, nil)
		for _, s := range scenarios {
			t.Run(s.name, func(t *testing.T) { s.run(t, c, db, b) })
		}
	})
}

var scenarios = []struct {
	name string
	run  func(t *testing.T, c Client, db *gorm.DB, b testenv.Broker)
}{
	{"the_same_record_delivered_three_times_has_one_effect", sameRecordThreeTimes},
	{"a_handler_error_rolls_back_and_is_retried_with_backoff", handlerErrorRetried},
	{"dead_letter_after_max_attempts_with_the_original_headers_and_the_error", deadLetter},
	{"a_database_outage_is_retried_and_never_dead_lettered", outage},
	{"a_stop_during_a_retry_returns_nil_and_commits_nothing", stopDuringRetry},
	{"a_stop_while_fetching_returns_nil", stopWhileFetching},
	{"a_transactional_topic_markers_skipped_aborted_records_as_the_client_reads_them", transactionalTopic},
	{"two_consumers_of_one_group_apply_each_record_once_across_a_rebalance", twoConsumersRebalance},
}

func sameRecordThreeTimes(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, group := newTopic(t, b, "inbox-three-", 1), testenv.Unique("g-")
	Produce(t, b, topic, withID(0, "three-x", "x1"), withID(0, "three-x", "x2"), withID(0, "three-y", "y"), withID(0, "three-x", "x3"))
	ib, metrics := setup(t, db, inbox.Options{})
	stop := runConsumer(t, c.New(t, b, ib, group, topic, "three", applyRecord, inbox.ConsumerOptions{}))
	WaitCommitted(t, b, group, topic, map[int]int64{0: 4})
	stop()
	if got, want := effectsInOrder(t, db), []string{"three-x", "three-y"}; !slices.Equal(got, want) {
		t.Fatalf("effects = %v; want %v", got, want)
	}
	var note string
	if err := db.Model(&effect{}).Where("message_id = ?", "three-x").Pluck("note", &note).Error; err != nil || note != "x1" {
		t.Fatalf("effect of three-x = %q, %v; want the first delivery's (x1)", note, err)
	}
	Collect(t, metrics).Check(t, Readings{inbox.MetricProcessed: 2, inbox.MetricDuplicates: 2, inbox.MetricFailures: 0})
}

func handlerErrorRetried(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, group := newTopic(t, b, "inbox-retry-", 1), testenv.Unique("g-")
	Produce(t, b, topic, withID(0, "retry-a", "a"), withID(0, "retry-b", "b"))
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	logs := &testenv.Logs{}
	ib, metrics := setup(t, db, inbox.Options{Clock: clock, Logger: logs.Logger()})
	var calls atomic.Int32
	fn := func(tx *gorm.DB, r Record) error {
		if err := applyRecord(tx, r); err != nil || string(r.Value) != "a" || calls.Add(1) > 2 {
			return err
		}
		return errInjected // after writing the effect: rolled back
	}
	runConsumer(t, c.New(t, b, ib, group, topic, "retry", fn, inbox.ConsumerOptions{RetryBackoff: time.Second, MaxRetryBackoff: 10 * time.Second}))
	ctx := WithTimeout(t, time.Minute)
	for attempt, max := range []time.Duration{time.Second, 2 * time.Second} {
		if !clock.WaitForWaiters(ctx, 1) {
			t.Fatalf("the consumer never waited after failure %d", attempt+1)
		}
		at, _ := clock.NextDeadline()
		if wait := at.Sub(clock.Now()); wait < max/2 || wait > max {
			t.Fatalf("backoff after failure %d = %v; want within [%v, %v]", attempt+1, wait, max/2, max)
		}
		if n := effects(t, db, "retry-a"); n != 0 {
			t.Fatalf("effects of retry-a after failure %d = %d; want 0 (rolled back)", attempt+1, n)
		}
		if got := Committed(t, b, group, topic, 1)[0]; got > 0 {
			t.Fatalf("committed offset after failure %d = %d; want none (the record is not skipped)", attempt+1, got)
		}
		clock.Advance(max)
	}
	WaitCommitted(t, b, group, topic, map[int]int64{0: 2})
	if got, want := effectsInOrder(t, db), []string{"retry-a", "retry-b"}; !slices.Equal(got, want) {
		t.Fatalf("effects = %v; want %v", got, want)
	}
	Collect(t, metrics).Check(t, Readings{inbox.MetricProcessed: 2, inbox.MetricFailures: 2})
	if warns := logs.Matching("level=WARN msg=\"handling failed; retrying the message\""); len(warns) != 1 {
		t.Fatalf("WARN lines for a repeated failure = %d; want 1 (then DEBUG):\n%s", len(warns), strings.Join(warns, "\n"))
	}
}

func deadLetter(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, dlq, group := newTopic(t, b, "inbox-dl-", 1), newTopic(t, b, "inbox-dlq-", 1), testenv.Unique("g-")
	Produce(t, b, topic, withID(0, "poison", "p"), withID(0, "", "no-id"), withID(0, "fine", "f"))
	ib, metrics := setup(t, db, inbox.Options{})
	fn := func(tx *gorm.DB, r Record) error {
		if err := applyRecord(tx, r); err != nil || string(r.Value) != "p" {
			return err
		}
		return fmt.Errorf("cannot ship: %w", errInjected)
	}
	stop := runConsumer(t, c.New(t, b, ib, group, topic, "dl", fn, inbox.ConsumerOptions{
		DeadLetterTopic: dlq, MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
	}))
	WaitCommitted(t, b, group, topic, map[int]int64{0: 3})
	stop()
	if got, want := effectsInOrder(t, db), []string{"fine"}; !slices.Equal(got, want) {
		t.Fatalf("effects = %v; want %v", got, want)
	}
	got := b.ReadAll(t, dlq, 2, time.Minute)
	if len(got) != 2 {
		t.Fatalf("dead-letter records = %d; want 2", len(got))
	}
	for i, want := range []struct {
		value, id, errText, offset, attempts string
	}{
		{"p", "poison", "cannot ship: injected failure", "0", "3"},
		{"no-id", "", "inbox: no message id", "1", "1"}, // no retry can give it an id
	} {
		m := got[i]
		if string(m.Value) != want.value {
			t.Fatalf("dead-letter record %d value = %q; want %q", i, m.Value, want.value)
		}
		if tr, _ := header(m.Headers, "trace"); tr != "t-"+want.value || m.Headers[0].Key != "trace" {
			t.Errorf("dead-letter record %d headers = %v; want the original ones first", i, m.Headers)
		}
		if id, ok := header(m.Headers, kafkapub.DefaultMessageIDHeader); want.id != "" && (!ok || id != want.id) {
			t.Errorf("dead-letter record %d message id = %q; want %q", i, id, want.id)
		}
		for key, v := range map[string]string{
			inbox.HeaderHandler: "dl", inbox.HeaderAttempts: want.attempts, inbox.HeaderTopic: topic,
			inbox.HeaderPartition: "0", inbox.HeaderOffset: want.offset,
		} {
			if got, _ := header(m.Headers, key); got != v {
				t.Errorf("dead-letter record %d header %s = %q; want %q", i, key, got, v)
			}
		}
		if e, _ := header(m.Headers, inbox.HeaderError); !strings.Contains(e, want.errText) {
			t.Errorf("dead-letter record %d error = %q; want it to contain %q", i, e, want.errText)
		}
		if string(m.Key) != "key-"+want.id {
			t.Errorf("dead-letter record %d key = %q; want %q", i, m.Key, "key-"+want.id)
		}
	}
	Collect(t, metrics).Check(t, Readings{inbox.MetricDeadLettered: 2, inbox.MetricFailures: 4, inbox.MetricProcessed: 1})
}

func outage(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, dlq, group := newTopic(t, b, "inbox-outage-", 1), newTopic(t, b, "inbox-dlq-", 1), testenv.Unique("g-")
	Produce(t, b, topic, withID(0, "outage", "o"))
	// An inbox on a table that does not exist yet: every Handle fails in
	// the database, before the handler.
	table := testenv.Unique("inbox_later_")
	ib, metrics := setup(t, db, inbox.Options{Config: inbox.Config{Table: table}})
	must(t, db.Migrator().DropTable(table))
	runConsumer(t, c.New(t, b, ib, group, topic, "outage", applyRecord, inbox.ConsumerOptions{
		DeadLetterTopic: dlq, MaxAttempts: 1, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
	}))
	if !eventually(10*time.Millisecond, func() bool { return Collect(t, metrics)[inbox.MetricFailures] >= 5 }) {
		t.Fatal("the consumer did not retry the failing database")
	}
	must(t, inbox.AutoMigrate(db, inbox.Config{Table: table}))
	WaitCommitted(t, b, group, topic, map[int]int64{0: 1})
	if n := effects(t, db, "outage"); n != 1 {
		t.Fatalf("effects = %d; want 1", n)
	}
	Collect(t, metrics).Check(t, Readings{inbox.MetricDeadLettered: 0, inbox.MetricProcessed: 1})
}

func stopDuringRetry(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, group := newTopic(t, b, "inbox-stop-", 1), testenv.Unique("g-")
	Produce(t, b, topic, withID(0, "stuck", "s"))
	clock := relaytest.NewManualClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	ib, _ := setup(t, db, inbox.Options{Clock: clock})
	stop := runConsumer(t, c.New(t, b, ib, group, topic, "stop", func(*gorm.DB, Record) error { return errInjected }, inbox.ConsumerOptions{}))
	if !clock.WaitForWaiters(WithTimeout(t, time.Minute), 1) {
		t.Fatal("the consumer never waited to retry")
	}
	stop() // fails t unless Run returns nil within 30s
	if got := Committed(t, b, group, topic, 1)[0]; got > 0 {
		t.Fatalf("committed offset = %d; want none", got)
	}
}

func stopWhileFetching(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, group := newTopic(t, b, "inbox-idle-", 1), testenv.Unique("g-")
	ib, metrics := setup(t, db, inbox.Options{})
	stop := runConsumer(t, c.New(t, b, ib, group, topic, "idle", applyRecord, inbox.ConsumerOptions{}))
	time.Sleep(200 * time.Millisecond) // let Run reach the fetch
	stop()
	Collect(t, metrics).Check(t, Readings{inbox.MetricHandleDuration: 0})
}

// transactionalTopic reads a partition as fenced publishing leaves it after
// a zombie: an aborted transaction whose record c the next owner publishes
// again, and an aborted record z never published again. The markers are
// never handled, failed or dead-lettered, and the group's offset passes
// the last one. Each id's effect is applied once, in the order of its first
// copy the client returns (z only on a client that hands aborted records
// over, the limit the README states).
func transactionalTopic(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	topic, dlq, group := newTopic(t, b, "inbox-txn-", 1), newTopic(t, b, "inbox-dlq-", 1), testenv.Unique("g-")
	produceTxn(t, b, topic, true, "a", "b")
	produceTxn(t, b, topic, false, "c", "z")
	produceTxn(t, b, topic, true, "c", "d")
	// a b M(commit) c z M(abort) c d M(commit): a client that returns the
	// markers commits past the last one; one that drops them, past d.
	end := int64(9)
	if c.SkipsAborted {
		end = 8
	}

	ib, metrics := setup(t, db, inbox.Options{})
	stop := runConsumer(t, c.New(t, b, ib, group, topic, "txn", applyRecord, inbox.ConsumerOptions{
		DeadLetterTopic: dlq, MaxAttempts: 1, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond,
	}))
	WaitCommitted(t, b, group, topic, map[int]int64{0: end})
	stop()
	want, dups := []string{"a", "b", "c", "z", "d"}, int64(1)
	if c.SkipsAborted {
		want, dups = []string{"a", "b", "c", "d"}, 0
	}
	if got := effectsInOrder(t, db); !slices.Equal(got, want) {
		t.Fatalf("effects in order = %v; want %v", got, want)
	}
	Collect(t, metrics).Check(t, Readings{inbox.MetricProcessed: int64(len(want)), inbox.MetricDuplicates: dups, inbox.MetricFailures: 0, inbox.MetricDeadLettered: 0})
}

// twoConsumersRebalance: records on four partitions, two consumers of one
// group, and one of them stopped half-way (its partitions move to the
// other, which may get records the first had handled but not committed):
// every record has exactly one effect, each partition's in offset order.
func twoConsumersRebalance(t *testing.T, c Client, db *gorm.DB, b testenv.Broker) {
	const partitions, perPartition = 4, 25
	topic, group := newTopic(t, b, "inbox-rebalance-", partitions), testenv.Unique("g-")
	ib, metrics := setup(t, db, inbox.Options{})
	opts := inbox.ConsumerOptions{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond}
	slow := func(tx *gorm.DB, r Record) error {
		time.Sleep(2 * time.Millisecond)
		return applyRecord(tx, r)
	}
	a := c.New(t, b, ib, group, topic, "rebalance", slow, opts)
	stopA := runConsumer(t, a)
	runConsumer(t, c.New(t, b, ib, group, topic, "rebalance", slow, opts))
	var msgs []kafka.Message
	want := map[int]int64{}
	for p := range partitions {
		for i := range perPartition {
			id := fmt.Sprintf("p%d-%03d", p, i)
			msgs = append(msgs, withID(p, id, id))
		}
		want[p] = perPartition
	}
	Produce(t, b, topic, msgs[:len(msgs)/2]...)
	if !eventually(5*time.Millisecond, func() bool { return Collect(t, metrics)[inbox.MetricProcessed] >= int64(len(msgs)/4) }) {
		t.Fatal("the consumers processed too little to stop one half-way")
	}
	stopA()
	a.Close() // its partitions move to the other
	Produce(t, b, topic, msgs[len(msgs)/2:]...)
	WaitCommitted(t, b, group, topic, want)
	got := effectsInOrder(t, db)
	if len(got) != len(msgs) {
		t.Fatalf("effects = %d; want %d (one per record)", len(got), len(msgs))
	}
	last := map[byte]string{}
	for _, id := range got {
		if prev := last[id[1]]; id <= prev {
			t.Fatalf("effect %s after %s: partition order broken", id, prev)
		}
		last[id[1]] = id
	}
	// A record whose transaction committed as the first consumer stopped,
	// its offset not, counts as a duplicate for the second: processed may
	// be short by the records in flight at the stop, never over.
	m := Collect(t, metrics)
	processed, dups := m[inbox.MetricProcessed], m[inbox.MetricDuplicates]
	if processed > int64(len(msgs)) || processed+dups < int64(len(msgs)) || processed < int64(len(msgs))-int64(partitions) || m[inbox.MetricFailures] != 0 {
		t.Errorf("processed %d, duplicates %d, failures %d; want %d records processed or, at most one per partition in flight at the stop, seen again as duplicates, and no failure",
			processed, dups, m[inbox.MetricFailures], len(msgs))
	}
}

// effect is the side effect the suite's handlers write: one row per
// application of a message.
type effect struct {
	ID        uint   `gorm:"primaryKey"`
	MessageID string `gorm:"size:300"`
	Note      string `gorm:"size:100"`
}

func (effect) TableName() string { return "consumertest_effects" }

// applyRecord writes one effect row for r's message id, with its value as
// the note.
func applyRecord(tx *gorm.DB, r Record) error {
	id, _ := header(r.Headers, kafkapub.DefaultMessageIDHeader)
	return tx.Create(&effect{MessageID: id, Note: string(r.Value)}).Error
}

// withID returns a record for partition carrying id in the message-id
// header (none for "") and note as its value, after a "trace" header.
func withID(partition int, id, note string) kafka.Message {
	m := kafka.Message{Partition: partition, Key: []byte("key-" + id), Value: []byte(note), Headers: []kafka.Header{{Key: "trace", Value: []byte("t-" + note)}}}
	if id != "" {
		m.Headers = append(m.Headers, kafka.Header{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(id)})
	}
	return m
}

// setup migrates the inbox and effect tables (the effects emptied) and
// returns an Inbox with opts whose instruments a fresh reader collects.
func setup(t testing.TB, db *gorm.DB, opts inbox.Options) (*inbox.Inbox, *metrictest.Reader) {
	t.Helper()
	must(t, inbox.AutoMigrate(db, opts.Config))
	must(t, db.Migrator().DropTable(&effect{}))
	must(t, db.AutoMigrate(&effect{}))
	reader := metrictest.NewReader()
	opts.MeterProvider = reader.MeterProvider()
	ib, err := inbox.New(db, opts)
	must(t, err)
	return ib, reader
}

// effects returns the number of effect rows for id.
func effects(t testing.TB, db *gorm.DB, id string) int64 {
	t.Helper()
	var n int64
	must(t, db.Model(&effect{}).Where("message_id = ?", id).Count(&n).Error)
	return n
}

// effectsInOrder returns the message ids of the effect rows in the order
// they were written.
func effectsInOrder(t testing.TB, db *gorm.DB) []string {
	t.Helper()
	var ids []string
	must(t, db.Model(&effect{}).Order("id").Pluck("message_id", &ids).Error)
	return ids
}

// Readings are the inbox's counters (summed over attributes) and histogram
// counts, by instrument name.
type Readings map[string]int64

// Collect returns r's current Readings, failing t when it cannot collect.
func Collect(t testing.TB, r *metrictest.Reader) Readings {
	t.Helper()
	m, out := r.Read(t), Readings{}
	for name, v := range m.Values {
		out[name] = int64(v)
	}
	for name, n := range m.Counts {
		out[name] = int64(n)
	}
	return out
}

// Check fails t unless r holds want for every named instrument.
func (r Readings) Check(t testing.TB, want Readings) {
	t.Helper()
	for name, w := range want {
		if r[name] != w {
			t.Errorf("%s = %d; want %d (all: %v)", name, r[name], w, r)
		}
	}
}

// WithTimeout returns a context ending after d or at t's end.
func WithTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// header returns the value of the last header key in hs, and whether there
// is one.
func header(hs []kafka.Header, key string) (string, bool) {
	v, ok := "", false
	for _, h := range hs {
		if h.Key == key {
			v, ok = string(h.Value), true
		}
	}
	return v, ok
}

// must fails t on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newTopic creates a topic named prefix and random hex with partitions on
// b, and returns its name.
func newTopic(t testing.TB, b testenv.Broker, prefix string, partitions int) string {
	t.Helper()
	topic := testenv.Unique(prefix)
	b.CreateTopic(t, topic, partitions, nil)
	return topic
}

// errInjected is the error the suite's handlers inject.
var errInjected = errors.New("injected failure")

// runConsumer runs c until the returned stop is called; stop fails t
// unless Run returned nil.
func runConsumer(t testing.TB, c Consumer) (stop func()) {
	return Start(t, context.Background(), "consumer", c.Run)
}

// Start runs run on a child of ctx until the returned stop is called (at
// t's cleanup at the latest); stop fails t unless run returned nil within
// 30s.
func Start(t testing.TB, ctx context.Context, name string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run = %v; want nil after the stop", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s: Run did not return within 30s of the stop", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// produceTxn writes one transaction of records (value and message id:
// each of ids, key "k") to partition 0 of topic and commits or aborts it.
func produceTxn(t testing.TB, b testenv.Broker, topic string, commit bool, ids ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs...), kgo.TransactionalID(testenv.Unique("txn-")),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	must(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(t, cl.BeginTransaction())
	for _, id := range ids {
		r := &kgo.Record{Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(id)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", id, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction: %v", err)
	}
}
