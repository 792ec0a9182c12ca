package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
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

// RunConfig configures a chaos run.
type RunConfig struct {
	// Bin is the outbox-chaos binary (the relay children).
	Bin string
	// Dialect and BaseDSN name the database server (sqlite: BaseDSN unused).
	Dialect, BaseDSN string
	// PoolerDSN (PostgreSQL only) is a connection pooler in front of
	// BaseDSN's server, e.g. PgBouncer in transaction pooling mode with
	// default_query_exec_mode=exec: when set, the writers, the relays and
	// the harness's checks connect through it to the run's database, which
	// is still created, killed-into and dropped through BaseDSN.
	PoolerDSN string
	// Brokers is the Kafka broker; empty starts an in-process kfake broker
	// and enables the broker faults.
	Brokers []string
	// Dir holds SQLite files and the children's logs.
	Dir string
	// Messages, Relays and Faults are the run's size. Zero means 20000, 3
	// and 24.
	Messages, Relays, Faults int
	// WriteFor is how long the writers take for Messages; the faults are
	// spread over it. Zero means 75s.
	WriteFor time.Duration
	// DrainTimeout bounds the wait for the table to drain after the faults.
	// Zero means 90s.
	DrainTimeout time.Duration
	// Seed seeds the fault schedule and the writers.
	Seed int64
	// Logger receives progress. Nil means slog.Default().
	Logger *slog.Logger
	// Transactional runs the transactional variant (see txn.go).
	Transactional bool
	// Membership runs the membership variant (see membership.go): the
	// fixed schedule of membership changes replaces the faults and the
	// poison key, Faults and WriteFor are ignored, and Messages and Relays
	// default to membershipRate a second and 2.
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
	// DBKills are the database-kill faults, in order.
	DBKills []DBKill
	// RelayStoreWarnings counts the WARN lines of the relays' logs about a
	// failed database statement (see storeWarnings) logged during a
	// database-kill fault or within dbKillEcho after it;
	// RelayStoreWarningsTotal counts them over the whole run.
	RelayStoreWarnings, RelayStoreWarningsTotal int
	Took                                        time.Duration
	// Transactional: the transactional variant; RawOrderViolations are
	// its checker's per-key inversions without deduplication (see
	// Consumer.RawOrderViolations), UnexplainedOrderViolations those of
	// them that no batch published again explains (see
	// Consumer.UnexplainedOrderViolations).
	Transactional              bool
	RawOrderViolations         int
	UnexplainedOrderViolations int
	// PoisonParked: the poison key's head (see poison) was seen parked;
	// PoisonRequeued is how many rows its requeue changed.
	PoisonParked   bool
	PoisonRequeued int64
	// Membership: the membership variant; Handovers are its figures per
	// kind of change, Delay its longest delivery delay (commit to the
	// checker's read) and OwnerSampling the longest time between two
	// samples of the owners.
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
	kinds := make([]string, 0, len(s.Faults))
	total := 0
	for k, n := range s.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	dbkill := fmt.Sprintf(" relay_store_warns=%d", s.RelayStoreWarningsTotal)
	if len(s.DBKills) > 0 {
		killed, mid := s.DBKillTotals()
		dbkill = fmt.Sprintf(" dbkill_sessions=%d (mid-statement %d) relay_store_warns=%d (during dbkill %d)", killed, mid, s.RelayStoreWarningsTotal, s.RelayStoreWarnings)
	}
	return fmt.Sprintf("chaos: db=%s broker=%s relays=%d messages=%d committed=%d rolled_back=%d in_doubt=%d lost=%d rolled_back_arrived=%d order_violations=%d dual_owners=%d (lease changes %d, audits %d) drained=%t duplicates=%d records=%d poison_parked=%t poison_requeued=%d faults=%d (%s)%s took=%s",
		s.Dialect, s.Broker, s.Relays, s.Written, s.Committed, s.RolledBack, s.InDoubt, s.Check.Lost, s.Check.RolledBackArrived, s.Check.OrderViolations,
		s.DualOwners, s.LeaseChanges, s.LeaseAudits, s.Drained, s.Check.Duplicates, s.Check.Records, s.PoisonParked, s.PoisonRequeued, total, strings.Join(kinds, " "), dbkill+s.txnSummary(), s.Took.Round(time.Second))
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
	switch {
	case s.Check.Lost != 0:
		return fmt.Errorf("chaos: %d committed messages lost", s.Check.Lost)
	case s.Check.RolledBackArrived != 0:
		return fmt.Errorf("chaos: %d rolled-back messages arrived", s.Check.RolledBackArrived)
	case s.Check.OrderViolations != 0:
		return fmt.Errorf("chaos: %d per-key order violations", s.Check.OrderViolations)
	case s.Transactional && s.UnexplainedOrderViolations != 0:
		return fmt.Errorf("chaos: %d per-key order violations without deduplication that no batch published again explains (of %d in all)", s.UnexplainedOrderViolations, s.RawOrderViolations)
	case s.DualOwners != 0:
		return fmt.Errorf("chaos: %d takeovers of a live lease", s.DualOwners)
	case !s.Drained:
		return errors.New("chaos: the outbox table did not drain")
	case !s.PoisonParked && !s.Membership:
		return errors.New("chaos: the poison row was never parked")
	}
	return nil
}

// ledger is what the writers committed.
type ledger struct {
	mu         sync.Mutex
	perKey     map[string][]string
	keyless    []string
	doubt      map[string]bool
	rolledBack map[string]bool
	written    int
	committed  int
	// committedAt, when not nil, records when each committed id's
	// transaction committed.
	committedAt map[string]time.Time
}

// Run performs a chaos run and returns its summary; the error is a setup
// failure (see Summary.Err for the checks).
func Run(ctx context.Context, cfg RunConfig) (Summary, error) {
	start := time.Now()
	if cfg.Membership {
		cfg.WriteFor = membershipSpan()
		if cfg.Messages == 0 {
			cfg.Messages = int(membershipRate * cfg.WriteFor.Seconds())
		}
		if cfg.Relays == 0 {
			cfg.Relays = 2
		}
	}
	if cfg.Messages == 0 {
		cfg.Messages = 20000
	}
	if cfg.Relays == 0 {
		cfg.Relays = 3
	}
	if cfg.Faults == 0 {
		cfg.Faults = 24
	}
	if cfg.WriteFor == 0 {
		cfg.WriteFor = 75 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 90 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	s := Summary{Dialect: cfg.Dialect, Broker: "kafka", Relays: cfg.Relays, Faults: map[string]int{}, Transactional: cfg.Transactional, Membership: cfg.Membership}
	var fake *kfake.Cluster
	if len(cfg.Brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
		if err != nil {
			return s, fmt.Errorf("chaos: start kfake: %w", err)
		}
		defer c.Close()
		fake, cfg.Brokers, s.Broker = c, c.ListenAddrs(), "kfake"
	}
	d, err := CreateDatabase(ctx, cfg.Dialect, cfg.BaseDSN, cfg.Dir)
	if err != nil {
		return s, err
	}
	defer d.Drop(ctx)
	clientDSN := d.DSN
	if cfg.PoolerDSN != "" {
		if cfg.Dialect != Postgres {
			return s, fmt.Errorf("chaos: RunConfig.PoolerDSN needs PostgreSQL, not %s", cfg.Dialect)
		}
		clientDSN = withPostgresParam(cfg.PoolerDSN, "dbname", d.name)
		s.Dialect += "+pooler"
	}
	topic := unique("chaos_run_")
	if err := CreateTopic(ctx, cfg.Brokers, topic, partitions); err != nil {
		return s, err
	}
	cctx, cancelConsumer := context.WithCancel(ctx)
	consumer := startChecker(cctx, cfg.Transactional, cfg.Brokers, topic, partitions)
	defer consumer.Wait()
	defer cancelConsumer()

	db, err := Open(cfg.Dialect, clientDSN, harnessAppName, writers+2)
	if err != nil {
		return s, err
	}
	defer closeGorm(db)
	if err := db.Use(outbox.Plugin{}); err != nil {
		return s, err
	}

	relayDSN := d.RelayDSN
	if cfg.PoolerDSN != "" {
		relayDSN = clientDSN
	}
	relays := &Relays{Bin: cfg.Bin, LogDir: cfg.Dir, Base: RelayConfig{
		Dialect: cfg.Dialect, DSN: relayDSN, Brokers: cfg.Brokers,
		LeaseDuration: leaseDuration, RenewInterval: renewInterval, PollInterval: pollInterval, BatchSize: batchSize,
		TxnOutbox: txnOutbox(cfg.Transactional, topic),
	}}
	defer relays.StopAll(10 * time.Second)
	pool := &relayPool{relays: relays}
	for i := 0; i < cfg.Relays; i++ {
		if err := pool.add(); err != nil {
			return s, err
		}
	}

	// Lease auditor: the trigger records every owner change; the auditor
	// reads the verdict regularly so that a violation is seen during the run.
	auditCtx, stopAudit := context.WithCancel(ctx)
	var auditWG sync.WaitGroup
	audits := 0 // owned by the auditor until auditWG.Wait
	auditWG.Add(1)
	go func() {
		defer auditWG.Done()
		reported := false
		for auditCtx.Err() == nil {
			if v, _, err := DualOwners(db.WithContext(auditCtx)); err == nil {
				audits++
				if v > 0 && !reported {
					reported = true
					log.Error("chaos: a bucket had two live owners", "violations", v)
				}
			}
			select {
			case <-auditCtx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	// Writers.
	led := &ledger{perKey: map[string][]string{}, doubt: map[string]bool{}, rolledBack: map[string]bool{}, committedAt: map[string]time.Time{}}
	var wwg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			write(ctx, db, topic, w, cfg, led)
		}()
	}
	var poisonErr error
	if !cfg.Membership {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			s.PoisonParked, s.PoisonRequeued, poisonErr = poison(ctx, db, topic, cfg, led)
		}()
	}
	writersDone := make(chan struct{})
	go func() { wwg.Wait(); close(writersDone) }()

	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0xc4a05))
	var changes []change
	var watch *ownerWatch
	var membershipErr error
	if cfg.Membership {
		watch = newOwnerWatch(db)
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { watch.run(wctx); close(watched) }()
		changes, membershipErr = changeMembership(ctx, pool, watch, rng, log)
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
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
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
		if inject(ctx, kind, rng, pool, fake, &fwg, log) {
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
	s.Drained = drain(ctx, db, led, consumer, cfg.DrainTimeout)
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
		s.RawOrderViolations = consumer.RawOrderViolations(led.perKey)
		s.UnexplainedOrderViolations = consumer.UnexplainedOrderViolations(led.perKey)
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
		for _, k := range s.DBKills {
			if !at.Before(k.At) && at.Before(k.At.Add(k.Took+dbKillEcho)) {
				s.RelayStoreWarnings++
				break
			}
		}
	}
	s.Took = time.Since(start)
	if err := cmp.Or(poisonErr, membershipErr); err != nil {
		return s, err
	}
	return s, ctx.Err()
}

// write is one writer: it owns its keys (so their writes are serialised)
// and commits or rolls back transactions of 1 to 4 messages, paced to
// spread its share of the messages over cfg.WriteFor. Key k0 of each writer
// pins an explicit partition; a few messages are keyless.
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

// relayPool keeps the relay processes of a run: the live ones a fault may
// pick, and the replacements of stopped ones.
type relayPool struct {
	relays *Relays
	mu     sync.Mutex
	live   []*Proc // not paused, not stopping
	next   int
}

func (p *relayPool) add() error {
	pr, err := p.start("relay")
	if err != nil {
		return err
	}
	p.give(pr)
	return nil
}

// start starts a relay named prefix-N with extra environment (see
// Relays.Start), outside the live pool (give adds it).
func (p *relayPool) start(prefix string, env ...string) (*Proc, error) {
	p.mu.Lock()
	p.next++
	id := fmt.Sprintf("%s-%d", prefix, p.next)
	p.mu.Unlock()
	return p.relays.Start(id, env...)
}

// take removes a random live relay from the pool, or returns nil.
func (p *relayPool) take(rng *rand.Rand) *Proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.live) == 0 {
		return nil
	}
	i := rng.IntN(len(p.live))
	pr := p.live[i]
	p.live = append(p.live[:i], p.live[i+1:]...)
	return pr
}

func (p *relayPool) give(pr *Proc) {
	p.mu.Lock()
	p.live = append(p.live, pr)
	p.mu.Unlock()
}

// faultSchedule returns n fault kinds in random order: every kind at least
// once when n allows it (so that a short run still has each fault), the
// rest drawn at random.
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

// dbKillEcho is how long after a database-kill fault a relay's WARN still
// counts as its echo: a relay blocked on the harness's lock reports the
// killed connection at once; one that was idle meets it at its next
// statement (it reconnects silently: see KillClientSessions).
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
	if err != nil {
		return nil, err
	}
	var at []time.Time
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "time=") || !strings.Contains(line, " level=WARN ") {
				continue
			}
			for _, m := range storeWarnMessages {
				if strings.Contains(line, m) {
					ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
					if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
						at = append(at, t)
					}
					break
				}
			}
		}
	}
	return at, nil
}

// inject injects one fault of kind (a process or broker fault) and reports
// whether it was injected. Process faults finish in the background (tracked
// by wg).
func inject(ctx context.Context, kind string, rng *rand.Rand, pool *relayPool, fake *kfake.Cluster, wg *sync.WaitGroup, log *slog.Logger) bool {
	log.Info("chaos: fault", "kind", kind)
	switch kind {
	case FaultKill, FaultTerm, FaultPause:
		pr := pool.take(rng)
		if pr == nil {
			return false
		}
		pause := leaseDuration + time.Second + time.Duration(rng.Int64N(int64(time.Second))) // rng stays on this goroutine
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch kind {
			case FaultKill:
				pr.Signal(syscall.SIGKILL)
				<-pr.Done()
				time.Sleep(300 * time.Millisecond)
			case FaultTerm:
				pr.Signal(syscall.SIGTERM)
				select {
				case <-pr.Done():
				case <-time.After(15 * time.Second):
					pr.Signal(syscall.SIGKILL)
					<-pr.Done()
				}
			case FaultPause:
				pr.Signal(syscall.SIGSTOP)
				time.Sleep(pause)
				pr.Signal(syscall.SIGCONT)
				pool.give(pr)
				return
			}
			if err := pool.add(); err != nil {
				log.Error("chaos: restart relay", "error", err)
			}
		}()
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

// drain waits up to timeout for the messages table to empty, reporting
// whether it did, then up to a minute for the consumer to see every id the
// ledger is sure was committed, then a second more for late copies.
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
