package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/relay"
)

// DrainResult is one drain run: N preloaded rows moved to Kafka.
type DrainResult struct {
	// Name is "raw loop", "naive relay" or "relay".
	Name string `json:"name"`
	// Relays is the relay (or worker) count.
	Relays int `json:"relays"`
	// Rows is the number of rows drained.
	Rows int `json:"rows"`
	// Seconds is the time from the preload's commit until the table was
	// empty and the consumer had read every id.
	Seconds float64 `json:"seconds"`
	// MsgPerSec is Rows / Seconds.
	MsgPerSec float64 `json:"msg_per_sec"`
	// VsRaw and VsNaive are MsgPerSec relative to the baselines of the same
	// run (0 when that baseline did not run).
	VsRaw   float64 `json:"vs_raw"`
	VsNaive float64 `json:"vs_naive"`
	// CPUPerSec is this process's CPU time (relays, consumer and, with
	// kfake, the broker) per wall-clock second of the drain.
	CPUPerSec float64 `json:"cpu_per_sec"`
	// PreloadSeconds is how long the one-transaction preload took.
	PreloadSeconds float64 `json:"preload_seconds"`
	// Note qualifies the run (e.g. no SKIP LOCKED on SQLite).
	Note string `json:"note,omitempty"`
}

// fanout forwards commit notifications to every relay of a fleet, as the
// plugin of a process hosting several relays would.
type fanout struct {
	mu sync.Mutex
	ns []*relay.Notifier
}

var _ outbox.BucketNotifier = (*fanout)(nil)

func (f *fanout) add(n *relay.Notifier) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ns = append(f.ns, n)
}

func (f *fanout) each(fn func(*relay.Notifier)) {
	f.mu.Lock()
	ns := f.ns
	f.mu.Unlock()
	for _, n := range ns {
		fn(n)
	}
}

func (f *fanout) NotifyCommitted()       { f.each(func(n *relay.Notifier) { n.NotifyCommitted() }) }
func (f *fanout) NotifyBucket(b int)     { f.each(func(n *relay.Notifier) { n.NotifyBucket(b) }) }
func (f *fanout) NotifyBuckets(bs []int) { f.each(func(n *relay.Notifier) { n.NotifyBuckets(bs) }) }

// NonBlockingNotifier marks fanout as safe to call on the committing
// goroutine: relay notifiers never block.
func (f *fanout) NonBlockingNotifier() {}

func (e *env) outboxConfig() outbox.Config { return outbox.Config{BucketCount: e.cfg.Buckets} }

func (e *env) log() *slog.Logger { return e.cfg.Logger }

// warnOnly passes on warnings and errors only: the relays' start, stop and
// ownership logs would drown the harness's progress.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// value is a record value of Config.ValueSize bytes.
func (e *env) value() []byte { return []byte(strings.Repeat("v", e.cfg.ValueSize)) }

func keyOf(prefix string, i int) []byte { return []byte(prefix + strconv.Itoa(i)) }

func perSec(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// ratio is a / b, or 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func cpuPerSec(cpu, wall time.Duration) float64 { return cpu.Seconds() / wall.Seconds() }

// preload commits n rows to topic in one transaction (so that they all
// appear at once) and returns when the commit returned.
func (e *env) preload(ctx context.Context, db *gorm.DB, topic string, n int) (time.Time, time.Duration, error) {
	value := e.value()
	start := time.Now()
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		const chunk = 500
		batch := make([]*outbox.Message, 0, chunk)
		for i := 0; i < n; i++ {
			batch = append(batch, outbox.NewMessage(topic, keyOf("key-", i), value))
			if len(batch) == chunk || i == n-1 {
				if err := outbox.Enqueue(tx, batch...); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		return nil
	})
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("preload %d rows: %w", n, err)
	}
	end := time.Now()
	return end, end.Sub(start), nil
}

// waitDrained waits until the consumer read n distinct ids and the
// messages table is empty. It fails when the consumer makes no progress
// for a minute.
func (e *env) waitDrained(ctx context.Context, db *gorm.DB, c *consumer, n int) (time.Time, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last, lastChange := -1, time.Now()
	consumed := false
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-c.done():
			consumed = true
		case <-tick.C:
		}
		if consumed {
			var ids []int64
			if err := db.WithContext(ctx).Table(outbox.DefaultMessagesTable).Limit(1).Pluck("id", &ids).Error; err != nil {
				return time.Time{}, fmt.Errorf("probe remaining rows: %w", err)
			}
			if len(ids) == 0 {
				return time.Now(), nil
			}
			continue
		}
		if got := c.count(); got != last {
			last, lastChange = got, time.Now()
		} else if time.Since(lastChange) > time.Minute {
			return time.Time{}, fmt.Errorf("stalled: consumer read %d of %d ids, no progress for a minute", got, n)
		}
	}
}

// runDrain runs the raw loop, the naive relay and the relay with each
// configured relay count, each on a fresh table and topic.
func runDrain(ctx context.Context, e *env) ([]DrainResult, error) {
	var out []DrainResult
	raw, err := e.drainBaseline(ctx, "raw loop", e.cfg.N, e.rawLoop)
	if err != nil {
		return nil, err
	}
	raw.Note = "SELECT 500 → one kafka-go write → DELETE id <= last; no coordination, database/sql"
	out = append(out, raw)
	naive, err := e.drainBaseline(ctx, "naive relay", e.cfg.NaiveN, e.naiveLoop)
	if err != nil {
		return nil, err
	}
	naive.Note = "one row per tx: SELECT … FOR UPDATE SKIP LOCKED, produce, DELETE, COMMIT"
	if e.dialect == "sqlite" {
		naive.Note = "one row per tx (BEGIN IMMEDIATE; SQLite has no FOR UPDATE SKIP LOCKED): SELECT, produce, DELETE, COMMIT"
	}
	naive.VsRaw = ratio(naive.MsgPerSec, raw.MsgPerSec)
	out = append(out, naive)
	for _, r := range e.cfg.Relays {
		res, err := e.drainRelays(ctx, r)
		if err != nil {
			return nil, err
		}
		res.VsRaw = ratio(res.MsgPerSec, raw.MsgPerSec)
		res.VsNaive = ratio(res.MsgPerSec, naive.MsgPerSec)
		out = append(out, res)
	}
	return out, nil
}

// loopFunc drains the table into topic until it is empty.
type loopFunc func(ctx context.Context, db *sql.DB, w *kafka.Writer) error

func (e *env) writer(topic string, batch int) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(e.brokers...),
		Topic:        topic,
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    batch,
		BatchTimeout: time.Nanosecond,
	}
}

func (e *env) drainBaseline(ctx context.Context, name string, n int, loop loopFunc) (DrainResult, error) {
	e.log().Info("bench: drain", "name", name, "rows", n)
	db, err := e.open(&outbox.Plugin{Config: e.outboxConfig()})
	if err != nil {
		return DrainResult{}, err
	}
	defer closeDB(db)
	if err := e.reset(db); err != nil {
		return DrainResult{}, err
	}
	topic, err := e.createTopic(ctx, "bench_drain_")
	if err != nil {
		return DrainResult{}, err
	}
	defer e.deleteTopic(topic)
	sqlDB, err := db.DB()
	if err != nil {
		return DrainResult{}, err
	}
	w := e.writer(topic, max(e.cfg.BatchSize, 1))
	if name == "naive relay" {
		w.BatchSize = 1
	}
	defer w.Close()
	if err := warmWriter(ctx, w); err != nil {
		return DrainResult{}, fmt.Errorf("%s: %w", name, err)
	}
	c := startConsumer(ctx, e.brokers, topic, e.cfg.Partitions, n)
	defer c.stop()
	start, pre, err := e.preload(ctx, db, topic, n)
	if err != nil {
		return DrainResult{}, err
	}
	cpu0 := cpuTime()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	loopErr := make(chan error, 1)
	go func() { loopErr <- loop(lctx, sqlDB, w) }()
	end, err := e.waitDrained(ctx, db, c, n)
	cancel()
	if lerr := <-loopErr; lerr != nil && !errors.Is(lerr, context.Canceled) {
		return DrainResult{}, fmt.Errorf("%s: %w", name, lerr)
	}
	if err != nil {
		return DrainResult{}, fmt.Errorf("%s: %w", name, err)
	}
	wall := end.Sub(start)
	return DrainResult{Name: name, Relays: 1, Rows: n, Seconds: wall.Seconds(), MsgPerSec: perSec(n, wall),
		CPUPerSec: cpuPerSec(cpuTime()-cpu0, wall), PreloadSeconds: pre.Seconds()}, nil
}

// warmWriter writes one record without a message id (the consumer ignores
// it) until the writer's metadata knows the new topic, and warms its
// connections.
func warmWriter(ctx context.Context, w *kafka.Writer) error {
	var err error
	for range 100 {
		if err = w.WriteMessages(ctx, kafka.Message{Value: []byte("warm-up")}); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("warm-up write: %w", err)
}

// ph returns the i-th (1-based) placeholder of the dialect.
func (e *env) ph(i int) string {
	if e.dialect == "postgres" {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// scanRow reads id, message id, key and value.
func scanRow(sc interface{ Scan(...any) error }) (int64, kafka.Message, error) {
	var id int64
	var mid outbox.UUID
	var m kafka.Message
	if err := sc.Scan(&id, &mid, &m.Key, &m.Value); err != nil {
		return 0, m, err
	}
	m.Headers = []kafka.Header{{Key: relay.DefaultMessageIDHeader, Value: []byte(mid.String())}}
	return id, m, nil
}

// rawLoop is the raw limit: select a batch, one write, delete, repeat.
func (e *env) rawLoop(ctx context.Context, db *sql.DB, w *kafka.Writer) error {
	sel := fmt.Sprintf("SELECT id, message_id, record_key, record_value FROM %s ORDER BY id LIMIT %d", outbox.DefaultMessagesTable, e.cfg.BatchSize)
	del := fmt.Sprintf("DELETE FROM %s WHERE id <= %s", outbox.DefaultMessagesTable, e.ph(1))
	batch := make([]kafka.Message, 0, e.cfg.BatchSize)
	for ctx.Err() == nil {
		rows, err := db.QueryContext(ctx, sel)
		if err != nil {
			return err
		}
		batch = batch[:0]
		var last int64
		for rows.Next() {
			id, m, err := scanRow(rows)
			if err != nil {
				rows.Close()
				return err
			}
			batch, last = append(batch, m), id
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(batch) == 0 {
			return nil
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, del, last); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// naiveLoop is the pattern of most blog posts: one row per transaction,
// locked with FOR UPDATE SKIP LOCKED, produced, deleted, committed.
func (e *env) naiveLoop(ctx context.Context, db *sql.DB, w *kafka.Writer) error {
	sel := fmt.Sprintf("SELECT id, message_id, record_key, record_value FROM %s ORDER BY id LIMIT 1", outbox.DefaultMessagesTable)
	if e.dialect != "sqlite" {
		sel += " FOR UPDATE SKIP LOCKED"
	}
	del := fmt.Sprintf("DELETE FROM %s WHERE id = %s", outbox.DefaultMessagesTable, e.ph(1))
	for ctx.Err() == nil {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		id, m, err := scanRow(tx.QueryRowContext(ctx, sel))
		if errors.Is(err, sql.ErrNoRows) {
			if err := tx.Rollback(); err != nil && ctx.Err() == nil {
				return err
			}
			return ctx.Err() // nil: drained; else cancelled, which rolled the transaction back
		}
		if err == nil {
			err = w.WriteMessages(ctx, m)
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, del, id)
		}
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if ctx.Err() != nil {
			// Cancelled once the table drained: database/sql rolled the
			// transaction back (sql.ErrTxDone), which is no failure.
			return ctx.Err()
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// fleet is a set of running relays on one database and broker.
type fleet struct {
	once   sync.Once
	err    error
	fan    *fanout
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	close  []func()
}

// startFleet starts n relays, each with its own connection pool, store and
// publisher. open returns each relay's *gorm.DB; wrap, when non-nil, wraps
// each publisher.
func (e *env) startFleet(ctx context.Context, n int, open func() (*gorm.DB, error), opts relay.Options, wrap func(relay.Publisher) relay.Publisher) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{fan: &fanout{}, cancel: cancel}
	for i := range n {
		db, err := open()
		if err != nil {
			f.stop()
			return nil, err
		}
		f.close = append(f.close, func() { closeDB(db) })
		store, err := gormstore.New(db, gormstore.Options{Config: e.outboxConfig()})
		if err != nil {
			f.stop()
			return nil, err
		}
		kp, err := relay.NewKafkaPublisher(relay.KafkaConfig{Brokers: e.brokers})
		if err != nil {
			f.stop()
			return nil, err
		}
		f.close = append(f.close, func() { _ = kp.Close() })
		var pub relay.Publisher = kp
		if wrap != nil {
			pub = wrap(kp)
		}
		o := opts
		o.RelayID = fmt.Sprintf("bench-%d-%s", i, unique(""))
		o.BatchSize = e.cfg.BatchSize
		if o.Logger == nil {
			o.Logger = slog.New(warnOnly{e.log().Handler()})
		}
		r, err := relay.New(store, pub, o)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.fan.add(r.Notifier())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := r.Run(ctx); err != nil {
				f.mu.Lock()
				f.errs = append(f.errs, err)
				f.mu.Unlock()
			}
		}()
	}
	return f, nil
}

// stop stops the relays, waits for them and closes their resources.
// It is idempotent.
func (f *fleet) stop() error {
	f.once.Do(func() {
		f.cancel()
		f.wg.Wait()
		for i := len(f.close) - 1; i >= 0; i-- {
			f.close[i]()
		}
		f.mu.Lock()
		f.err = errors.Join(f.errs...)
		f.mu.Unlock()
	})
	return f.err
}

// waitBalanced waits until n relays hold every bucket in fair shares.
func (e *env) waitBalanced(ctx context.Context, db *gorm.DB, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	want := min(n, e.cfg.Buckets)
	most := (e.cfg.Buckets + n - 1) / n
	for {
		var rows []struct {
			Owner string
			N     int
		}
		now := time.Now().UnixMilli()
		err := db.WithContext(ctx).Table(outbox.DefaultLeasesTable).Select("owner, COUNT(*) AS n").
			Where("owner IS NOT NULL AND expires_at_ms > ?", now).Group("owner").Scan(&rows).Error
		if err != nil {
			return fmt.Errorf("read leases: %w", err)
		}
		total, top := 0, 0
		for _, r := range rows {
			total += r.N
			top = max(top, r.N)
		}
		if len(rows) == want && total == e.cfg.Buckets && top <= most {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d relays not balanced after 2 minutes: %+v", n, rows)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e *env) drainRelays(ctx context.Context, n int) (DrainResult, error) {
	e.log().Info("bench: drain", "name", "relay", "relays", n, "rows", e.cfg.N)
	admin, err := e.open(nil)
	if err != nil {
		return DrainResult{}, err
	}
	defer closeDB(admin)
	if err := e.reset(admin); err != nil {
		return DrainResult{}, err
	}
	topic, err := e.createTopic(ctx, "bench_drain_")
	if err != nil {
		return DrainResult{}, err
	}
	defer e.deleteTopic(topic)
	f, err := e.startFleet(ctx, n, func() (*gorm.DB, error) { return e.open(nil) }, relay.Options{}, nil)
	if err != nil {
		return DrainResult{}, err
	}
	defer f.stop()
	if err := e.waitBalanced(ctx, admin, n); err != nil {
		return DrainResult{}, err
	}
	w, err := e.open(&outbox.Plugin{Config: e.outboxConfig(), Notifier: f.fan})
	if err != nil {
		return DrainResult{}, err
	}
	defer closeDB(w)
	c := startConsumer(ctx, e.brokers, topic, e.cfg.Partitions, e.cfg.N)
	defer c.stop()
	start, pre, err := e.preload(ctx, w, topic, e.cfg.N)
	if err != nil {
		return DrainResult{}, err
	}
	cpu0 := cpuTime()
	end, err := e.waitDrained(ctx, admin, c, e.cfg.N)
	if err != nil {
		return DrainResult{}, fmt.Errorf("relay ×%d: %w", n, err)
	}
	cpu := cpuTime() - cpu0
	if err := f.stop(); err != nil {
		return DrainResult{}, fmt.Errorf("relay ×%d: %w", n, err)
	}
	wall := end.Sub(start)
	return DrainResult{Name: "relay", Relays: n, Rows: e.cfg.N, Seconds: wall.Seconds(), MsgPerSec: perSec(e.cfg.N, wall),
		CPUPerSec: cpuPerSec(cpu, wall), PreloadSeconds: pre.Seconds(),
		Note: fmt.Sprintf("gormstore + KafkaPublisher, %d buckets, batch %d, leases balanced before the preload commit", e.cfg.Buckets, e.cfg.BatchSize)}, nil
}
