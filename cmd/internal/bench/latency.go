package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
)

// Latency notification modes: the writer's plugin notifies the relay in
// the same process; none (the relay polls); the writer's commit hints
// travel through PostgreSQL LISTEN/NOTIFY (package pgnotify), as between
// pods.
const (
	ModeLocal    = "local"
	ModePoll     = "poll"
	ModePgNotify = "pgnotify"
)

// LatencyResult is one steady-rate latency run. Times are in
// milliseconds from the return of the writer's Commit: to the relay's
// Publish returning with the row acknowledged (ack), to a consumer reading
// it (consume); commit is the writers' transaction.
type LatencyResult struct {
	Mode       string  `json:"mode"`
	Rate       int     `json:"rate"`     // target commits per second
	Achieved   float64 `json:"achieved"` // measured
	Messages   int     `json:"messages"`
	WarmUp     int     `json:"warm_up"` // rows committed before, at the same rate, not measured
	AckP50     float64 `json:"ack_p50_ms"`
	AckP95     float64 `json:"ack_p95_ms"`
	AckP99     float64 `json:"ack_p99_ms"`
	AckMax     float64 `json:"ack_max_ms"`
	ConsumeP50 float64 `json:"consume_p50_ms"`
	ConsumeP95 float64 `json:"consume_p95_ms"`
	ConsumeP99 float64 `json:"consume_p99_ms"`
	CommitP50  float64 `json:"commit_p50_ms"`
	CommitP99  float64 `json:"commit_p99_ms"`
	// FailedCommits counts writers' transactions that failed (rolled back,
	// not in the percentiles).
	FailedCommits int    `json:"failed_commits"`
	Note          string `json:"note,omitempty"`
}

// ackRecorder wraps a publisher and records when each row was acknowledged
// (when Publish returned with it in the acknowledged prefix).
type ackRecorder struct {
	inner relay.Publisher
	mu    sync.Mutex
	at    map[outbox.UUID]time.Time
}

func (a *ackRecorder) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := a.inner.Publish(ctx, batches)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, batch := range batches {
		for _, m := range batch[:min(max(results[i].Acknowledged, 0), len(batch))] {
			if _, ok := a.at[m.MessageID]; !ok {
				a.at[m.MessageID] = now
			}
		}
	}
	return results
}

func (a *ackRecorder) OwnedBuckets(buckets []int) { a.inner.OwnedBuckets(buckets) }

func (a *ackRecorder) get(id outbox.UUID) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// pgSender is the writer side of the cross-pod transport: a non-blocking
// notifier whose hints one goroutine sends with NOTIFY.
type pgSender struct {
	ch chan []int
}

func (s *pgSender) NotifyCommitted()     { s.NotifyBuckets([]int{-1}) }
func (s *pgSender) NotifyBucket(b int)   { s.NotifyBuckets([]int{b}) }
func (s *pgSender) NonBlockingNotifier() {}
func (s *pgSender) NotifyBuckets(bs []int) {
	select {
	case s.ch <- slices.Clone(bs):
	default: // full: the relay's poll finds the rows
	}
}

func runLatency(ctx context.Context, e *env, rep *Report) ([]LatencyResult, error) {
	var out []LatencyResult
	for _, mode := range e.cfg.LatencyModes {
		if mode == ModePgNotify && e.cfg.DB != "postgres" {
			rep.Notes = append(rep.Notes, "latency: pgnotify mode needs PostgreSQL; not measured on "+e.cfg.DB)
			continue
		}
		for _, rate := range e.cfg.Rates {
			res, err := e.latency(ctx, mode, rate)
			if err != nil {
				return nil, fmt.Errorf("%s at %d/s: %w", mode, rate, err)
			}
			out = append(out, res)
		}
	}
	return out, nil
}

func (e *env) latency(ctx context.Context, mode string, rate int) (LatencyResult, error) {
	e.cfg.Logger.Info("bench: latency", "mode", mode, "rate", rate, "duration", e.cfg.LatencyDuration)
	admin, topic, done, err := e.scenario(ctx, "bench_latency_")
	if err != nil {
		return LatencyResult{}, err
	}
	defer done()
	c, err := startConsumer(ctx, e.brokers, topic, e.cfg.Partitions, 0)
	if err != nil {
		return LatencyResult{}, err
	}
	defer c.stop()
	acks := &ackRecorder{at: map[outbox.UUID]time.Time{}}
	f, err := e.startFleet(ctx, 1, func() (*gorm.DB, error) { return e.open(nil) }, relay.Options{},
		func(p relay.Publisher) relay.Publisher { acks.inner = p; return acks })
	if err != nil {
		return LatencyResult{}, err
	}
	defer f.stop()
	if err := e.waitBalanced(ctx, admin, 1); err != nil {
		return LatencyResult{}, err
	}

	plugin := &outbox.Plugin{Config: e.outboxConfig()}
	switch mode {
	case ModeLocal:
		plugin.Notifier = f.fan
	case ModePgNotify:
		stop, err := e.pgnotify(ctx, plugin, f.fan)
		if err != nil {
			return LatencyResult{}, err
		}
		defer stop()
	}
	w, err := e.open(plugin)
	if err != nil {
		return LatencyResult{}, err
	}
	defer closeDB(w)
	value := e.value()

	commitOne := func(i int) (outbox.UUID, time.Time, time.Duration, error) {
		m := outbox.NewMessage(topic, keyOf("lat-", i), value)
		begin := time.Now()
		err := w.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return tx.Create(m).Error })
		end := time.Now()
		return m.MessageID, end, end.Sub(begin), err
	}
	// Warm-up: one row end to end.
	id, _, _, err := commitOne(-1)
	if err != nil {
		return LatencyResult{}, err
	}
	if err := waitFor(ctx, 30*time.Second, func() bool {
		_, a := acks.get(id)
		_, b := c.readAt(id.String())
		return a && b
	}); err != nil {
		_, a := acks.get(id)
		return LatencyResult{}, fmt.Errorf("warm-up row (acknowledged %v, consumed %d, consumer error %v): %w", a, c.count(), c.stop(), err)
	}

	type commit struct {
		id  outbox.UUID
		at  time.Time
		dur time.Duration
	}
	// The run's first tenth, at most a second, warms up and is not
	// measured: its commits open the writers', the relay's and the broker's
	// connections.
	warm := int(float64(rate) * min(time.Second, e.cfg.LatencyDuration/10).Seconds())
	total := int(float64(rate) * e.cfg.LatencyDuration.Seconds())
	jobs := make(chan int, warm+total)
	var mu sync.Mutex
	commits := make([]commit, 0, total)
	var werr error // the first failed commit
	failed := 0
	var wg sync.WaitGroup
	for range min(32, max(1, rate/20)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				id, at, dur, err := commitOne(i)
				if i < warm {
					continue
				}
				mu.Lock()
				if err != nil {
					if werr == nil {
						werr = err
					}
					failed++
				} else {
					commits = append(commits, commit{id, at, dur})
				}
				mu.Unlock()
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	begin := time.Now()
	start := begin.Add(time.Duration(warm) * interval) // the measured commits'
	for i := range warm + total {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	// A commit that fails (MariaDB answers a writer's INSERT with a
	// deadlock when it meets the relay's DELETE in the bucket index) rolled
	// its row back: it is counted and reported, not measured; a run where
	// most commits fail is an error.
	if werr != nil && failed*2 > total {
		return LatencyResult{}, fmt.Errorf("%d of %d commits failed, first: %w", failed, total, werr)
	}
	if err := waitFor(ctx, time.Minute, func() bool {
		for _, cm := range commits {
			if _, ok := acks.get(cm.id); !ok {
				return false
			}
			if _, ok := c.readAt(cm.id.String()); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		acked, read := 0, 0
		for _, cm := range commits {
			if _, ok := acks.get(cm.id); ok {
				acked++
			}
			if _, ok := c.readAt(cm.id.String()); ok {
				read++
			}
		}
		return LatencyResult{}, fmt.Errorf("waiting for acks and consumption of %d rows (acknowledged %d, consumed %d): %w", len(commits), acked, read, err)
	}
	var ack, cons, dur []time.Duration
	for _, cm := range commits {
		a, _ := acks.get(cm.id)
		r, _ := c.readAt(cm.id.String())
		ack = append(ack, max(a.Sub(cm.at), 0))
		cons = append(cons, max(r.Sub(cm.at), 0))
		dur = append(dur, cm.dur)
	}
	res := LatencyResult{Mode: mode, Rate: rate, Achieved: float64(len(commits)) / elapsed.Seconds(), Messages: len(commits), WarmUp: warm,
		AckP50: pct(ack, 50), AckP95: pct(ack, 95), AckP99: pct(ack, 99), AckMax: pct(ack, 100),
		ConsumeP50: pct(cons, 50), ConsumeP95: pct(cons, 95), ConsumeP99: pct(cons, 99),
		CommitP50: pct(dur, 50), CommitP99: pct(dur, 99), FailedCommits: failed}
	if werr != nil {
		res.Note = fmt.Sprintf("at %d/s %d of %d commits failed (rolled back, not measured), first: %v; ", rate, failed, total, werr)
	}
	switch mode {
	case ModePoll:
		// No notification announced these rows: PollInterval bounds their
		// wait, at most 2 × PollInterval at any bucket count.
		poll := relay.DefaultPollInterval
		over := 0
		for _, d := range ack {
			if d > 2*poll {
				over++
			}
		}
		res.Note += fmt.Sprintf("PollInterval %v; at %d/s, %d buckets: ack p50 %.2f×, p99 %.2f×, max %.2f× PollInterval; %d of %d rows over 2× PollInterval",
			poll, rate, e.cfg.Buckets, res.AckP50/ms(poll), res.AckP99/ms(poll), res.AckMax/ms(poll), over, len(ack))
	case ModePgNotify:
		res.Note += "pgnotify wired by the harness (writer NOTIFY → relay LISTEN → Notifier)"
	}
	res.Note = strings.TrimSuffix(res.Note, "; ")
	return res, f.stop()
}

// pgnotify carries the writers' commit hints through PostgreSQL
// LISTEN/NOTIFY to fan, as between pods: plugin's notifier queues them for
// one goroutine that NOTIFYs, another LISTENs. It returns once the listener
// receives.
func (e *env) pgnotify(ctx context.Context, plugin *outbox.Plugin, fan *fanout) (stop func(), err error) {
	tr, err := pgnotify.New(pgnotify.Config{ConnString: e.dsn, Channel: testenv.Unique("bench_"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	var bg sync.WaitGroup
	bgCtx, bgCancel := context.WithCancel(ctx)
	stop = func() { bgCancel(); bg.Wait(); tr.Close() }
	sender := &pgSender{ch: make(chan []int, 4096)}
	plugin.Notifier = sender
	bg.Go(func() {
		for {
			select {
			case <-bgCtx.Done():
				return
			case bs := <-sender.ch:
				_ = tr.Publish(bgCtx, bs)
			}
		}
	})
	ready := make(chan struct{})
	var once sync.Once
	bg.Go(func() {
		for bgCtx.Err() == nil {
			err := tr.Listen(bgCtx, func(b int) {
				once.Do(func() { close(ready) })
				fan.NotifyBucket(b)
			})
			if err != nil && bgCtx.Err() == nil {
				e.cfg.Logger.Warn("bench: pgnotify listen", "error", err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	// Probe until the listener has subscribed and receives.
	for probeUntil := time.Now().Add(30 * time.Second); ; {
		select {
		case <-ready:
			return stop, nil
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(probeUntil) {
				stop()
				return nil, errors.New("pgnotify listener received nothing in 30s")
			}
			_ = tr.Publish(ctx, []int{-1})
		}
	}
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waitFor polls cond every 5ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// pct returns the p-th percentile of ds in milliseconds (nearest rank).
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return ms(s[min(max(i, 0), len(s)-1)])
}
