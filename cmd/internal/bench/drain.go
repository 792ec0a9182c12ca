package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// DrainResult is one drain run: Rows preloaded rows moved to Kafka, timed
// from the preload's commit (the baselines: from after their ANALYZE)
// until the table was empty and the consumer had read every id.
type DrainResult struct {
	Name      string  `json:"name"`   // raw loop, naive relay or relay
	Relays    int     `json:"relays"` // relays (or workers)
	Rows      int     `json:"rows"`
	Seconds   float64 `json:"seconds"`
	MsgPerSec float64 `json:"msg_per_sec"`
	// VsRaw and VsNaive compare MsgPerSec with the baselines of the run (0:
	// not run).
	VsRaw   float64 `json:"vs_raw"`
	VsNaive float64 `json:"vs_naive"`
	// CPU of this process (relays or loop, consumer, an in-process kfake)
	// per second and per message; CPUVsRaw against the raw loop's.
	CPUPerSec   float64 `json:"cpu_per_sec"`
	CPUPerMsgUs float64 `json:"cpu_per_msg_us"`
	CPUVsRaw    float64 `json:"cpu_vs_raw"`
	// DBCPUPerMsgUs is the CPU of the PostgreSQL backends serving the run
	// (this host only, else 0; a lower bound, see backendCPU); AllCPUVsRaw
	// both per message against the raw loop's.
	DBCPUPerMsgUs float64 `json:"db_cpu_per_msg_us,omitempty"`
	AllCPUVsRaw   float64 `json:"all_cpu_vs_raw,omitempty"`
	// The consumer's rate of distinct ids over the first and the last
	// quarter of the rows, and last / first (≥ 1: no slowdown at the end).
	FirstQuarterMsgPerSec float64 `json:"first_quarter_msg_per_sec"`
	LastQuarterMsgPerSec  float64 `json:"last_quarter_msg_per_sec"`
	EndVsStart            float64 `json:"end_vs_start"`
	// LeaseLosses (relays only) sums relay.MetricLeaseExpirations over the
	// fleet from its start until drained: no fault is injected.
	LeaseLosses          *int64  `json:"lease_losses,omitempty"`
	MaxConcurrentBuckets int     `json:"max_concurrent_buckets,omitempty"` // relays only, as configured
	PreloadSeconds       float64 `json:"preload_seconds"`
	AnalyzeSeconds       float64 `json:"analyze_seconds,omitempty"` // baselines only (see analyze)
	Note                 string  `json:"note,omitempty"`
}

// fanout forwards commit notifications to every relay of a fleet, as the
// plugin of a process hosting several relays would (the fleet is complete
// before the first commit).
type fanout struct{ ns []*relay.Notifier }

var _ outbox.BucketNotifier = (*fanout)(nil)

func (f *fanout) each(fn func(*relay.Notifier)) {
	for _, n := range f.ns {
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

// warnOnly passes on warnings and errors only: the relays' start, stop and
// ownership logs would drown the harness's progress.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

// value is a record value of Config.ValueSize bytes.
func (e *env) value() []byte { return []byte(strings.Repeat("v", e.cfg.ValueSize)) }

func keyOf(prefix string, i int) []byte { return []byte(prefix + strconv.Itoa(i)) }

// ratio is a / b, or 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// cpuPerMsgUs is cpu per message in microseconds, or 0 without rows.
func cpuPerMsgUs(cpu time.Duration, rows int) float64 {
	return ratio(float64(cpu.Microseconds()), float64(rows))
}

// vs fills d's ratios to the baselines (naive: nil for the naive relay).
func (d *DrainResult) vs(raw DrainResult, naive *DrainResult) {
	d.VsRaw = ratio(d.MsgPerSec, raw.MsgPerSec)
	if naive != nil {
		d.VsNaive = ratio(d.MsgPerSec, naive.MsgPerSec)
	}
	d.CPUVsRaw = ratio(d.CPUPerMsgUs, raw.CPUPerMsgUs)
	if d.DBCPUPerMsgUs > 0 && raw.DBCPUPerMsgUs > 0 {
		d.AllCPUVsRaw = ratio(d.CPUPerMsgUs+d.DBCPUPerMsgUs, raw.CPUPerMsgUs+raw.DBCPUPerMsgUs)
	}
}

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
		case <-c.reached:
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

// measure times a drain of n rows from start until waitDrained (probing
// with probe) returns, with this process's CPU and the database backends'
// (sampled through admin); begin starts the drain, and its stop function,
// when not nil, ends it after the table drained.
func (e *env) measure(ctx context.Context, probe *gorm.DB, admin *gorm.DB, c *consumer, n int, start time.Time, begin func() (stop func() error)) (DrainResult, error) {
	adminSQL, err := admin.DB()
	if err != nil {
		return DrainResult{}, err
	}
	cpu0 := cpuTime()
	dbCPU := e.startBackendCPU(ctx, adminSQL)
	stop := begin()
	end, err := e.waitDrained(ctx, probe, c, n)
	dbc, dbOK := dbCPU.stop(ctx)
	if stop != nil {
		if lerr := stop(); lerr != nil && !errors.Is(lerr, context.Canceled) {
			return DrainResult{}, lerr
		}
	}
	if err != nil {
		return DrainResult{}, err
	}
	wall, cpu := end.Sub(start), cpuTime()-cpu0
	q1, q4 := c.quarterRates(start)
	d := DrainResult{Relays: 1, Rows: n, Seconds: wall.Seconds(), MsgPerSec: float64(n) / wall.Seconds(),
		CPUPerSec: cpu.Seconds() / wall.Seconds(), CPUPerMsgUs: cpuPerMsgUs(cpu, n),
		FirstQuarterMsgPerSec: q1, LastQuarterMsgPerSec: q4, EndVsStart: ratio(q4, q1)}
	if dbOK {
		d.DBCPUPerMsgUs = cpuPerMsgUs(dbc, n)
	}
	return d, nil
}

// runDrain runs the raw loop, the naive relay and the relay with each
// configured relay count, each on a fresh table and topic.
func runDrain(ctx context.Context, e *env) ([]DrainResult, error) {
	raw, err := e.drainBaseline(ctx, "raw loop", e.cfg.N, e.rawLoop)
	if err != nil {
		return nil, err
	}
	raw.Note = "SELECT 500 → one kafka-go write → DELETE id <= last; no coordination, database/sql; table analyzed after the preload, clock started after that"
	naive, err := e.drainBaseline(ctx, "naive relay", e.cfg.NaiveN, e.naiveLoop)
	if err != nil {
		return nil, err
	}
	naive.Note = "one row per tx: SELECT … FOR UPDATE SKIP LOCKED, produce, DELETE, COMMIT"
	if e.cfg.DB == "sqlite" {
		naive.Note = "one row per tx (BEGIN IMMEDIATE; SQLite has no FOR UPDATE SKIP LOCKED): SELECT, produce, DELETE, COMMIT"
	}
	naive.vs(raw, nil)
	relays, err := each(e.cfg.Relays, func(n int) (DrainResult, error) {
		d, err := e.drainRelays(ctx, n)
		d.vs(raw, &naive)
		return d, err
	})
	if err != nil {
		return nil, err
	}
	return append([]DrainResult{raw, naive}, relays...), nil
}

// drainBaseline times loop, which drains the table into w's topic until it
// is empty.
func (e *env) drainBaseline(ctx context.Context, name string, n int, loop func(context.Context, *sql.DB, *kafka.Writer) error) (DrainResult, error) {
	e.cfg.Logger.Info("bench: drain", "name", name, "rows", n)
	admin, topic, done, err := e.scenario(ctx, "bench_drain_")
	if err != nil {
		return DrainResult{}, err
	}
	defer done()
	db, err := e.open(&outbox.Plugin{Config: e.outboxConfig()})
	if err != nil {
		return DrainResult{}, err
	}
	defer closeDB(db)
	sqlDB, err := db.DB()
	if err != nil {
		return DrainResult{}, err
	}
	w := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: max(e.cfg.BatchSize, 1), BatchTimeout: time.Nanosecond}
	if name == "naive relay" {
		w.BatchSize = 1
	}
	defer w.Close()
	if err := warmWriter(ctx, w); err != nil {
		return DrainResult{}, fmt.Errorf("%s: %w", name, err)
	}
	c, err := startConsumer(ctx, e.brokers, topic, e.cfg.Partitions, n)
	if err != nil {
		return DrainResult{}, err
	}
	defer c.stop()
	_, pre, err := e.preload(ctx, db, topic, n)
	if err != nil {
		return DrainResult{}, err
	}
	analyzed, err := e.analyze(ctx, admin)
	if err != nil {
		return DrainResult{}, err
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d, err := e.measure(ctx, db, admin, c, n, time.Now(), func() func() error {
		loopErr := make(chan error, 1)
		go func() { loopErr <- loop(lctx, sqlDB, w) }()
		return func() error { cancel(); return <-loopErr }
	})
	if err != nil {
		return DrainResult{}, fmt.Errorf("%s: %w", name, err)
	}
	d.Name, d.PreloadSeconds, d.AnalyzeSeconds = name, pre.Seconds(), analyzed.Seconds()
	return d, nil
}

// analyze updates the messages table's statistics after a baseline's
// preload, before its clock starts: without them PostgreSQL plans the raw
// loop's DELETE … WHERE id <= $1 as a scan, and a production loop runs on a
// table with statistics. The relays' statements stay on the indexes without.
func (e *env) analyze(ctx context.Context, db *gorm.DB) (time.Duration, error) {
	stmt := "ANALYZE " + outbox.DefaultMessagesTable
	if e.cfg.DB == "mysql" {
		stmt = "ANALYZE TABLE " + outbox.DefaultMessagesTable
	}
	begin := time.Now()
	if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
		return 0, fmt.Errorf("bench: %s: %w", stmt, err)
	}
	return time.Since(begin), nil
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
	if e.cfg.DB == "postgres" {
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
	m.Headers = []kafka.Header{{Key: kafkapub.DefaultMessageIDHeader, Value: []byte(mid.String())}}
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
	if e.cfg.DB != "sqlite" {
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
			return ctx.Err() // cancelled once drained: the rollback is no failure
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// fleet is a set of running relays on one database and broker.
type fleet struct {
	fan  *fanout
	wg   sync.WaitGroup
	errs chan error // one per relay at most
	// stop stops the relays, waits for them and closes their resources;
	// later calls return the first's error.
	stop func() error
}

// startFleet starts n relays, each with its own connection pool, store and
// publisher. open returns each relay's *gorm.DB; wrap, when non-nil, wraps
// each publisher.
func (e *env) startFleet(ctx context.Context, n int, open func() (*gorm.DB, error), opts relay.Options, wrap func(relay.Publisher) relay.Publisher) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{fan: &fanout{}, errs: make(chan error, n)}
	var closers []func()
	f.stop = sync.OnceValue(func() error {
		cancel()
		f.wg.Wait()
		for _, c := range slices.Backward(closers) {
			c()
		}
		close(f.errs)
		var errs []error
		for err := range f.errs {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	fail := func(err error) (*fleet, error) {
		_ = f.stop()
		return nil, err
	}
	for i := range n {
		db, err := open()
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { closeDB(db) })
		lg := opts.Logger
		switch {
		case lg != nil:
		case e.cfg.RelayLogger != nil:
			lg = e.cfg.RelayLogger.With("relay", i)
		default:
			lg = slog.New(warnOnly{e.cfg.Logger.Handler()})
		}
		// The store logs beside its relay (the pool warning among them).
		store, err := gormstore.New(db, gormstore.Options{Config: e.outboxConfig(), Logger: lg})
		if err != nil {
			return fail(err)
		}
		kp, err := kafkapub.New(kafkapub.Config{Brokers: e.brokers})
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { _ = kp.Close() })
		var pub relay.Publisher = kp
		if wrap != nil {
			pub = wrap(kp)
		}
		o := opts
		o.RelayID = fmt.Sprintf("bench-%d-%s", i, testenv.Unique(""))
		o.BatchSize, o.MaxConcurrentBuckets, o.Logger = e.cfg.BatchSize, e.cfg.MaxConcurrentBuckets, lg
		o.SingleWriter = e.cfg.DB == "sqlite"
		r, err := relay.New(store, pub, o)
		if err != nil {
			return fail(err)
		}
		f.fan.ns = append(f.fan.ns, r.Notifier())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := r.Run(ctx); err != nil {
				f.errs <- err
			}
		}()
	}
	return f, nil
}

// waitBalanced waits until n relays hold every bucket in fair shares.
func (e *env) waitBalanced(ctx context.Context, db *gorm.DB, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	want, most := min(n, e.cfg.Buckets), (e.cfg.Buckets+n-1)/n
	for {
		var rows []struct {
			Owner string
			N     int
		}
		err := db.WithContext(ctx).Table(outbox.DefaultLeasesTable).Select("owner, COUNT(*) AS n").
			Where("owner IS NOT NULL AND expires_at_ms > ?", time.Now().UnixMilli()).Group("owner").Scan(&rows).Error
		if err != nil {
			return fmt.Errorf("read leases: %w", err)
		}
		total, top := 0, 0
		for _, r := range rows {
			total, top = total+r.N, max(top, r.N)
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
	e.cfg.Logger.Info("bench: drain", "name", "relay", "relays", n, "rows", e.cfg.N)
	admin, topic, done, err := e.scenario(ctx, "bench_drain_")
	if err != nil {
		return DrainResult{}, err
	}
	defer done()
	// The relays' instruments go to an SDK MeterProvider read by hand, to
	// count lease losses (relay.MetricLeaseExpirations) over the fleet.
	metrics := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	f, err := e.startFleet(ctx, n, func() (*gorm.DB, error) { return e.open(nil) }, relay.Options{MeterProvider: mp}, nil)
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
	c, err := startConsumer(ctx, e.brokers, topic, e.cfg.Partitions, e.cfg.N)
	if err != nil {
		return DrainResult{}, err
	}
	defer c.stop()
	start, pre, err := e.preload(ctx, w, topic, e.cfg.N)
	if err != nil {
		return DrainResult{}, err
	}
	d, err := e.measure(ctx, admin, admin, c, e.cfg.N, start, func() func() error { return nil })
	if err != nil {
		return DrainResult{}, fmt.Errorf("relay ×%d: %w", n, err)
	}
	losses, err := counterSum(ctx, metrics, relay.MetricLeaseExpirations)
	if err != nil {
		return DrainResult{}, fmt.Errorf("relay ×%d: read lease losses: %w", n, err)
	}
	if err := f.stop(); err != nil {
		return DrainResult{}, fmt.Errorf("relay ×%d: %w", n, err)
	}
	conc := "max concurrent buckets: library default"
	if e.cfg.MaxConcurrentBuckets > 0 {
		conc = fmt.Sprintf("max concurrent buckets %d", e.cfg.MaxConcurrentBuckets)
	}
	d.Name, d.Relays, d.LeaseLosses, d.MaxConcurrentBuckets, d.PreloadSeconds = "relay", n, &losses, e.cfg.MaxConcurrentBuckets, pre.Seconds()
	d.Note = fmt.Sprintf("gormstore + kafkapub.Publisher, %d buckets, batch %d, %s, leases balanced before the preload commit", e.cfg.Buckets, e.cfg.BatchSize, conc)
	return d, nil
}

// counterSum collects reader and returns the sum of every data point of the
// int64 counter name (over all attribute sets, i.e. over all relays).
func counterSum(ctx context.Context, reader *sdkmetric.ManualReader, name string) (int64, error) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return 0, err
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				return 0, fmt.Errorf("%s is a %T, not an int64 sum", name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				n += dp.Value
			}
		}
	}
	return n, nil
}
