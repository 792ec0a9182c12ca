package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Fault kinds of a chaos run.
const (
	FaultKill      = "kill"        // SIGKILL a relay, start a replacement
	FaultPause     = "pause"       // SIGSTOP a relay for longer than the lease, then SIGCONT
	FaultTerm      = "term"        // SIGTERM (graceful stop), start a replacement
	FaultDBKill    = "dbkill"      // terminate the relays' database sessions, one of them mid-statement (Database.KillClientSessions)
	FaultProduce   = "produce_err" // the in-process broker fails one produce request (NOT_LEADER_FOR_PARTITION)
	FaultConnDrop  = "conn_drop"   // the in-process broker drops the connection of one produce request
	writers        = 8
	keysPerWriter  = 8
	rollbackChance = 0.1
)

// Env is where a run happens.
type Env struct {
	// Bin is the outbox-chaos binary built with -tags outbox_failpoints
	// (the relay and consumer children).
	Bin string
	// Dialect and BaseDSN name the database server (sqlite: a file in Dir).
	Dialect, BaseDSN string
	// Brokers is the Kafka broker; empty starts an in-process kfake broker
	// (the matrix and the chaos run), which adds the broker faults.
	Brokers []string
	// Dir holds SQLite files and the children's logs.
	Dir string
	// Logger receives progress. Nil means slog.Default().
	Logger *slog.Logger
}

// RunConfig configures a chaos run.
type RunConfig struct {
	Env
	// PoolerDSN (PostgreSQL only): a PgBouncer in front of BaseDSN's server
	// through which the writers, relays and checks connect.
	PoolerDSN string
	// Messages, Relays and Faults are the run's size (zero: 20000, 3, 24);
	// the writers take WriteFor (zero: 75s), over which the faults spread.
	Messages, Relays, Faults int
	WriteFor                 time.Duration
	// Seed seeds the fault schedule and the writers.
	Seed int64
	// Transactional runs the transactional variant (see txn.go).
	Transactional bool
	// Membership runs the membership variant (see membership.go): its
	// changes replace the faults and the poison key.
	Membership bool
}

// Summary is the verdict of a chaos run.
type Summary struct {
	Dialect, Broker          string
	Relays                   int
	Written, Committed       int // messages written in transactions / committed
	RolledBack, InDoubt      int // messages rolled back / with an unknown commit outcome
	Check                    Check
	DualOwners, LeaseChanges int64
	LeaseAudits              int
	Drained                  bool
	Faults                   map[string]int
	DBKills                  []DBKill // in order
	// RelayStoreWarnings counts the relays' store-error WARN lines (see
	// storeWarnings) during a database-kill fault or within dbKillEcho
	// after it; RelayStoreWarningsTotal over the whole run.
	RelayStoreWarnings, RelayStoreWarningsTotal int
	Took                                        time.Duration
	// The transactional variant: its checker's per-key inversions without
	// deduplication, and those of them no batch published again explains.
	Transactional              bool
	RawOrderViolations         int
	UnexplainedOrderViolations int
	// PoisonParked: the poison key's head was seen parked; PoisonRequeued
	// is how many rows its requeue changed.
	PoisonParked   bool
	PoisonRequeued int64
	// The membership variant: per kind of change, the longest delivery
	// delay, the longest time between two owner samples.
	Membership           bool
	Handovers            []Handover
	Delay, OwnerSampling time.Duration
}

// DBKillTotals sums the sessions the database-kill faults terminated, and
// those of them that were in the middle of a statement.
func (s Summary) DBKillTotals() (killed, midStatement int) {
	for _, k := range s.DBKills {
		killed += k.Killed
		midStatement += k.MidStatement
	}
	return killed, midStatement
}

// String is the one-line summary.
func (s Summary) String() string {
	if s.Membership {
		return s.membershipString()
	}
	var kinds []string
	for k, n := range s.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(kinds)
	dbkill := fmt.Sprintf(" relay_store_warns=%d", s.RelayStoreWarningsTotal)
	if len(s.DBKills) > 0 {
		killed, mid := s.DBKillTotals()
		dbkill = fmt.Sprintf(" dbkill_sessions=%d (mid-statement %d) relay_store_warns=%d (during dbkill %d)", killed, mid, s.RelayStoreWarningsTotal, s.RelayStoreWarnings)
	}
	return fmt.Sprintf("chaos: db=%s broker=%s relays=%d messages=%d committed=%d rolled_back=%d in_doubt=%d lost=%d rolled_back_arrived=%d order_violations=%d dual_owners=%d (lease changes %d, audits %d) drained=%t duplicates=%d records=%d poison_parked=%t poison_requeued=%d faults=%d (%s)%s took=%s",
		s.Dialect, s.Broker, s.Relays, s.Written, s.Committed, s.RolledBack, s.InDoubt, s.Check.Lost, s.Check.RolledBackArrived, s.Check.OrderViolations,
		s.DualOwners, s.LeaseChanges, s.LeaseAudits, s.Drained, s.Check.Duplicates, s.Check.Records, s.PoisonParked, s.PoisonRequeued, s.TotalFaults(), strings.Join(kinds, " "), dbkill+s.txnSummary(), s.Took.Round(time.Second))
}

// TotalFaults is the number of injected faults.
func (s Summary) TotalFaults() int {
	n := 0
	for _, v := range s.Faults {
		n += v
	}
	return n
}

// Err reports the first failed check, or nil.
func (s Summary) Err() error {
	if err := s.Check.err("chaos", s.DualOwners, s.Drained); err != nil {
		return err
	}
	switch {
	case s.Transactional && s.UnexplainedOrderViolations != 0:
		return fmt.Errorf("chaos: %d per-key order violations without deduplication that no batch published again explains (of %d in all)", s.UnexplainedOrderViolations, s.RawOrderViolations)
	case !s.PoisonParked && !s.Membership:
		return errors.New("chaos: the poison row was never parked")
	}
	return nil
}

// drainTimeout bounds the wait for the table to drain after the faults.
const drainTimeout = 90 * time.Second

// ledger is what the writers committed.
type ledger struct {
	mu         sync.Mutex
	perKey     map[string][]string
	keyless    []string
	doubt      map[string]bool
	rolledBack map[string]bool
	written    int
	committed  int
	// committedAt, when not nil: each committed id's commit time.
	committedAt map[string]time.Time
}

func newLedger() *ledger {
	return &ledger{perKey: map[string][]string{}, doubt: map[string]bool{}, rolledBack: map[string]bool{}}
}

// orDefault sets *v to d when it is zero.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// startKfake starts an in-process broker when brokers is empty.
func startKfake(brokers *[]string) (*kfake.Cluster, error) {
	if len(*brokers) > 0 {
		return nil, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
	if err != nil {
		return nil, fmt.Errorf("chaos: start kfake: %w", err)
	}
	*brokers = c.ListenAddrs()
	return c, nil
}

// openWriters opens the harness's connection with the outbox plugin.
func openWriters(dialect, dsn string, conns int) (*gorm.DB, error) {
	db, err := Open(dialect, dsn, harnessAppName, conns)
	if err == nil {
		if err = db.Use(outbox.Plugin{}); err != nil {
			closeGorm(db)
		}
	}
	return db, err
}

// Run performs a chaos run and returns its summary; the error is a setup
// failure (see Summary.Err for the checks).
func Run(ctx context.Context, cfg RunConfig) (Summary, error) {
	start := time.Now()
	if cfg.Membership {
		cfg.WriteFor = membershipSpan()
		orDefault(&cfg.Messages, int(membershipRate*cfg.WriteFor.Seconds()))
		orDefault(&cfg.Relays, 2)
	}
	orDefault(&cfg.Messages, 20000)
	orDefault(&cfg.Relays, 3)
	orDefault(&cfg.Faults, 24)
	orDefault(&cfg.WriteFor, 75*time.Second)
	orDefault(&cfg.Logger, slog.Default())
	log := cfg.Logger
	s := Summary{Dialect: cfg.Dialect, Broker: "kafka", Relays: cfg.Relays, Faults: map[string]int{}, Transactional: cfg.Transactional, Membership: cfg.Membership}
	fake, err := startKfake(&cfg.Brokers)
	if err != nil {
		return s, err
	}
	if fake != nil {
		defer fake.Close()
		s.Broker = "kfake"
	}
	d, err := CreateDatabase(ctx, cfg.Dialect, cfg.BaseDSN, cfg.Dir)
	if err != nil {
		return s, err
	}
	defer d.Drop(ctx)
	clientDSN, relayDSN := d.DSN, d.RelayDSN
	if cfg.PoolerDSN != "" {
		if cfg.Dialect != Postgres {
			return s, fmt.Errorf("chaos: RunConfig.PoolerDSN needs PostgreSQL, not %s", cfg.Dialect)
		}
		clientDSN = testenv.WithPostgresParam(cfg.PoolerDSN, "dbname", d.name)
		relayDSN = clientDSN
		s.Dialect += "+pooler"
	}
	topic := testenv.Unique("chaos_run_")
	if err := CreateTopic(ctx, cfg.Brokers, topic, partitions); err != nil {
		return s, err
	}
	cctx, cancelConsumer := context.WithCancel(ctx)
	consumer := startChecker(cctx, cfg.Transactional, cfg.Brokers, topic, partitions)
	defer consumer.Wait()
	defer cancelConsumer()
	db, err := openWriters(cfg.Dialect, clientDSN, writers+2)
	if err != nil {
		return s, err
	}
	defer closeGorm(db)
	relays := cfg.relays(RelayConfig{DSN: relayDSN, TxnOutbox: txnOutbox(cfg.Transactional, topic)})
	defer relays.StopAll(10 * time.Second)
	if err := relays.add(cfg.Relays); err != nil {
		return s, err
	}

	// Lease auditor: the trigger records every owner change; the auditor
	// reads the verdict regularly so that a violation is seen during the run.
	auditCtx, stopAudit := context.WithCancel(ctx)
	var auditWG sync.WaitGroup
	audits := 0 // owned by the auditor until auditWG.Wait
	auditWG.Go(func() {
		reported := false
		for auditCtx.Err() == nil {
			if v, _, err := DualOwners(db.WithContext(auditCtx)); err == nil {
				audits++
				if v > 0 && !reported {
					reported = true
					log.Error("chaos: a bucket had two live owners", "violations", v)
				}
			}
			sleepCtx(auditCtx, 250*time.Millisecond)
		}
	})

	led := newLedger()
	led.committedAt = map[string]time.Time{}
	var poisonErr error
	var poisoner func()
	if !cfg.Membership {
		poisoner = func() { s.PoisonParked, s.PoisonRequeued, poisonErr = poison(ctx, db, topic, cfg, led) }
	}
	writersDone := startWriters(ctx, db, topic, cfg, led, poisoner)

	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0xc4a05))
	var changes []change
	var watch *ownerWatch
	var membershipErr error
	if cfg.Membership {
		watch = newOwnerWatch(db)
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { watch.run(wctx); close(watched) }()
		changes, membershipErr = changeMembership(ctx, relays, watch, rng, log)
		stopWatch()
		<-watched
		cfg.Faults = 0 // the changes were the run's faults
	}
	// Faults, spread over WriteFor.
	kinds := []string{FaultKill, FaultPause, FaultTerm}
	if cfg.Dialect != SQLite {
		kinds = append(kinds, FaultDBKill)
	}
	if fake != nil {
		kinds = append(kinds, FaultProduce, FaultConnDrop)
	}
	interval := cfg.WriteFor / time.Duration(cfg.Faults+1)
	schedule := faultSchedule(rng, kinds, cfg.Faults)
	var fwg sync.WaitGroup
	for n := 0; n < cfg.Faults && ctx.Err() == nil; {
		sleepCtx(ctx, interval)
		kind := schedule[n]
		if kind == FaultDBKill {
			k, err := d.KillClientSessions(ctx)
			if err != nil {
				log.Warn("chaos: kill relay sessions", "error", err)
				continue
			}
			log.Info("chaos: killed the relays' database sessions", "sessions", k.Killed, "mid_statement", k.MidStatement, "locked", k.Locked, "blocked", k.Blocked, "waited", k.Waited, "took", k.Took)
			s.DBKills = append(s.DBKills, k)
			s.Faults[kind]++
			n++
			continue
		}
		if inject(ctx, kind, rng, relays, fake, &fwg, log) {
			s.Faults[kind]++
			n++
		} else {
			// no live relay to take: try another kind
			schedule[n] = kinds[rng.IntN(len(kinds))]
		}
	}
	fwg.Wait() // paused relays resumed, stopped ones replaced
	select {
	case <-writersDone:
	case <-ctx.Done():
	}
	log.Info("chaos: faults over; draining", "faults", s.TotalFaults(), "poison_parked", s.PoisonParked, "poison_requeued", s.PoisonRequeued)

	// Drain: the table empties and the checker sees every committed id.
	s.Drained = drain(ctx, db, led, consumer, drainTimeout)
	stopAudit()
	auditWG.Wait()
	s.LeaseAudits = audits
	if v, c, err := DualOwners(db); err == nil {
		s.DualOwners, s.LeaseChanges = v, c
	} else {
		return s, fmt.Errorf("chaos: read lease audit: %w", err)
	}
	led.mu.Lock()
	s.Check = consumer.Verify(led.perKey, led.keyless, led.doubt, led.rolledBack)
	if cfg.Transactional {
		s.RawOrderViolations, s.UnexplainedOrderViolations = consumer.txnOrderViolations(led.perKey)
	}
	s.Written, s.Committed, s.RolledBack, s.InDoubt = led.written, led.committed, len(led.rolledBack), len(led.doubt)
	if cfg.Membership {
		parts, _, _ := consumer.Snapshot()
		s.Handovers, s.Delay = handovers(changes, watch.gaps, led.committedAt, parts)
		s.OwnerSampling = watch.interval
	}
	led.mu.Unlock()
	relays.StopAll(10 * time.Second) // their logs complete
	warns, err := storeWarnings(cfg.Dir)
	if err != nil {
		return s, err
	}
	s.RelayStoreWarningsTotal = len(warns)
	for _, at := range warns {
		if slices.ContainsFunc(s.DBKills, func(k DBKill) bool { return k.echoed(at) }) {
			s.RelayStoreWarnings++
		}
	}
	s.Took = time.Since(start)
	if err := cmp.Or(poisonErr, membershipErr); err != nil {
		return s, err
	}
	return s, ctx.Err()
}

// startWriters starts the writers, and extra when not nil, and returns a
// channel closed when they are done.
func startWriters(ctx context.Context, db *gorm.DB, topic string, cfg RunConfig, led *ledger, extra func()) <-chan struct{} {
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() { write(ctx, db, topic, w, cfg, led) })
	}
	if extra != nil {
		wg.Go(extra)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// write is one writer of 1-4 message transactions over its own keys (so
// each key's writes are serialised), paced over cfg.WriteFor; k0 pins a
// partition, a few messages are keyless.
func write(ctx context.Context, db *gorm.DB, topic string, w int, cfg RunConfig, led *ledger) {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w)))
	share := cfg.Messages / writers
	if w == 0 {
		share += cfg.Messages % writers
	}
	start := time.Now()
	for written, seq := 0, 0; written < share && ctx.Err() == nil; {
		due := time.Duration(float64(cfg.WriteFor) * float64(written) / float64(share))
		if el := time.Since(start); el < due {
			time.Sleep(due - el)
		}
		n := min(1+rng.IntN(4), share-written)
		msgs := make([]*outbox.Message, n)
		for i := range msgs {
			k := rng.IntN(keysPerWriter)
			seq++
			m := outbox.NewStringMessage(topic, fmt.Sprintf("w%d-k%d", w, k), fmt.Sprint(seq))
			if k == 0 {
				p := int32(w % partitions)
				m.Partition = &p
			} else if rng.Float64() < 0.03 {
				m.Key = nil
			}
			msgs[i] = m
		}
		rollback := rng.Float64() < rollbackChance
		tx := db.WithContext(ctx).Begin()
		if tx.Error != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		err := outbox.Enqueue(tx, msgs...)
		outcome := "rolled back"
		if err != nil || rollback {
			tx.Rollback()
		} else if err := tx.Commit().Error; err != nil {
			outcome = "in doubt"
		} else {
			outcome = "committed"
		}
		committedAt := time.Now()
		written += n
		led.mu.Lock()
		led.written += n
		for _, m := range msgs {
			id := m.MessageID.String()
			if m.MessageID.IsZero() {
				continue
			}
			switch outcome {
			case "rolled back":
				led.rolledBack[id] = true
				continue
			case "in doubt":
				led.doubt[id] = true
			default:
				led.committed++
				if led.committedAt != nil {
					led.committedAt[id] = committedAt
				}
			}
			if m.Key == nil {
				led.keyless = append(led.keyless, id)
			} else {
				led.perKey[string(m.Key)] = append(led.perKey[string(m.Key)], id)
			}
		}
		led.mu.Unlock()
	}
}

// faultSchedule returns n fault kinds in random order, each kind at least
// once when n allows it.
func faultSchedule(rng *rand.Rand, kinds []string, n int) []string {
	s := make([]string, n)
	for i := range s {
		if i < len(kinds) {
			s[i] = kinds[i]
		} else {
			s[i] = kinds[rng.IntN(len(kinds))]
		}
	}
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// echoed reports whether at falls within the fault or dbKillEcho after it.
func (k DBKill) echoed(at time.Time) bool {
	return !at.Before(k.At) && at.Before(k.At.Add(k.Took+dbKillEcho))
}

// dbKillEcho is how long after a database-kill fault a relay's WARN still
// counts as its echo: an idle relay meets the kill at its next statement.
const dbKillEcho = 2 * time.Second

// storeWarnMessages are the relay's WARN messages about a failed store
// statement.
var storeWarnMessages = []string{
	`msg="store error; backing off"`,
	`msg="discovery of pending buckets failed;`,
	`msg="bucket store error;`,
	`msg="acquire leases failed"`,
	`msg="renew leases failed"`,
	`msg="release leases failed;`,
	`msg="mark published failed`,
}

// storeWarnings returns the times of the store-error WARN lines in the
// relay children's logs (dir/relay-*.log, slog's text format).
func storeWarnings(dir string) ([]time.Time, error) {
	files, err := filepath.Glob(filepath.Join(dir, "relay-*.log"))
	var at []time.Time
	for _, f := range files {
		for _, l := range readLines(f) {
			t, ok := lineTime(l)
			if ok && strings.Contains(l, " level=WARN ") && slices.ContainsFunc(storeWarnMessages, func(m string) bool { return strings.Contains(l, m) }) {
				at = append(at, t)
			}
		}
	}
	return at, err
}

// inject injects one fault of kind and reports whether it did; process
// faults finish in the background (wg).
func inject(ctx context.Context, kind string, rng *rand.Rand, relays *Relays, fake *kfake.Cluster, wg *sync.WaitGroup, log *slog.Logger) bool {
	log.Info("chaos: fault", "kind", kind)
	switch kind {
	case FaultKill, FaultTerm, FaultPause:
		pr := relays.set.take(rng.IntN)
		if pr == nil {
			return false
		}
		pause := leaseDuration + time.Second + time.Duration(rng.Int64N(int64(time.Second))) // rng stays on this goroutine
		wg.Go(func() {
			switch kind {
			case FaultKill:
				pr.Kill()
				time.Sleep(300 * time.Millisecond)
			case FaultTerm:
				pr.Stop(15 * time.Second)
			case FaultPause:
				pr.Signal(syscall.SIGSTOP)
				time.Sleep(pause)
				pr.Signal(syscall.SIGCONT)
				relays.set.give(pr)
				return
			}
			if err := relays.add(1); err != nil {
				log.Error("chaos: restart relay", "error", err)
			}
		})
		return true
	case FaultProduce:
		fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			r := req.(*kmsg.ProduceRequest)
			resp := r.ResponseKind().(*kmsg.ProduceResponse)
			resp.Version = r.Version
			for _, t := range r.Topics {
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic = t.Topic
				rt.TopicID = t.TopicID
				for _, p := range t.Partitions {
					rp := kmsg.NewProduceResponseTopicPartition()
					rp.Partition = p.Partition
					rp.ErrorCode = 6 // NOT_LEADER_FOR_PARTITION: retriable
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		})
		return true
	case FaultConnDrop:
		fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			return nil, errors.New("chaos: dropped connection"), true
		})
		return true
	}
	return false
}

// drain waits up to timeout for the table to empty (reporting whether it
// did), then up to a minute for the consumer to see every surely committed
// id, then a second for late copies.
func drain(ctx context.Context, db *gorm.DB, led *ledger, consumer *Consumer, timeout time.Duration) (drained bool) {
	deadline := time.Now().Add(timeout)
	for ctx.Err() == nil {
		var n int64
		if err := db.Model(&outbox.Message{}).Count(&n).Error; err == nil && n == 0 {
			drained = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	led.mu.Lock()
	var sure []string
	for _, ids := range led.perKey {
		for _, id := range ids {
			if !led.doubt[id] {
				sure = append(sure, id)
			}
		}
	}
	led.mu.Unlock()
	for end := time.Now().Add(60 * time.Second); !consumer.Has(sure) && time.Now().Before(end) && ctx.Err() == nil; {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // late copies
	return drained
}
