package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/inbox"
)

// The effects run (RunEffects): the audit that matters to users, read from
// the consumer's database. Writers commit business rows with their outbox
// messages, relay processes publish them (default or fenced mode), and
// consumer processes of each client apply one effect per message in their
// own database, while every fault below is injected. Each fault is proven
// from what the processes logged or wrote, not only from the harness's
// intent.
const (
	// FaultRelayKill: SIGKILL a relay, start a replacement. Proven by its
	// exit status.
	FaultRelayKill = "relay_kill"
	// FaultRelayPause: SIGSTOP a relay that owns buckets until a peer has
	// taken one of them (past its lease), then SIGCONT. Proven by the lease
	// audit trigger: an owner change away from it while it was stopped.
	FaultRelayPause = "relay_pause"
	// FaultZombie: an extra relay stops itself (failpoint action stop)
	// between its produce and its commit at its second publish —
	// kafkapub/before-commit in fenced mode, relay/during-publish (records
	// appended, the answer not yet seen) in the default mode — and is
	// resumed once peers own all its buckets and have published and deleted
	// rows newer than the ones it had in flight; then it stops gracefully.
	// Proven in fenced mode by its "publish fenced" line naming the refused
	// EndTxn (commit); in the default mode by the peers' progress.
	FaultZombie = "zombie"
	// FaultConsumerKill: an extra consumer of each client joins its group
	// and SIGKILLs itself after its 10th to 39th processed message's
	// transaction committed, before the offset commit (failpoint
	// inbox/after-commit). Proven by the failpoint's line and by a
	// "duplicate skipped" line of another member of its group for the
	// message of its last effect.
	FaultConsumerKill = "consumer_kill"
	// FaultRebalance: a consumer of each client leaves its group (SIGTERM)
	// and a new one joins. Proven by the "partitions assigned" line of a
	// member that stayed, logged after the leave (a new generation).
	FaultRebalance = "rebalance"
	// FaultBrokerPause: SIGSTOP the broker's JVM for brokerPause, then
	// SIGCONT. Proven per client by a gap of at least half the pause in the
	// effects applied, overlapping the pause.
	FaultBrokerPause = "broker_pause"
	// FaultOutboxDBKill: kill the relays' sessions, one of them
	// mid-statement (Database.KillClientSessions). Proven by a kill
	// mid-statement and a relay's store-error WARN within dbKillEcho.
	FaultOutboxDBKill = "outbox_db_kill"
	// FaultConsumerDBKill: kill the consumers' sessions in each client's
	// database while one of them is inside its transaction (blocked on the
	// counters table). Proven by a kill mid-statement and a consumer's
	// "handling failed; retrying the message" WARN within dbKillEcho.
	FaultConsumerDBKill = "consumer_db_kill"
)

// EffectsFaults returns the fault kinds of the effects run, in the order
// the summary lists them.
func EffectsFaults() []string {
	return []string{FaultRelayKill, FaultRelayPause, FaultZombie, FaultConsumerKill, FaultRebalance, FaultBrokerPause, FaultOutboxDBKill, FaultConsumerDBKill}
}

// Timing of the effects run's faults.
const (
	brokerPause   = 6 * time.Second  // a broker pause
	zombieWait    = 25 * time.Second // the longest a zombie stays stopped
	effectsPubTTL = 30 * time.Second // the relays' PublishTimeout: longer than zombieWait, so that the zombie's EndTxn is sent
)

// EffectsConfig configures RunEffects. Zero sizes take the defaults named.
type EffectsConfig struct {
	// Bin is the outbox-chaos binary built with -tags outbox_failpoints
	// (the relay and consumer children).
	Bin string
	// Dialect (postgres or mysql) and BaseDSN name the database server of
	// the outbox database and of each client's consumer database.
	Dialect, BaseDSN string
	// Brokers is the real Kafka broker; BrokerPID the process id of its JVM,
	// which the broker pause stops (see ServicesBrokerPID).
	Brokers   []string
	BrokerPID int
	// Dir holds the children's logs.
	Dir string
	// Transactional runs the relays in fenced mode
	// (kafkapub.Config.Transactions).
	Transactional bool
	// Clients are the consumer clients (ClientKafkaGo, ClientFranz), each
	// a consumer group with a database of its own. Nil means both.
	Clients []string
	// Messages is the number of business rows (one message each) written
	// over WriteFor: zero means 4000 over 45s. The writers keep that rate
	// until the last fault is over, so that every fault meets writers at
	// work: a run whose faults outlast WriteFor writes more.
	Messages int
	WriteFor time.Duration
	// Keys is the number of keys (zero: 32), Relays the relay processes
	// (zero: 3), Consumers the members of each group (zero: 2).
	Keys, Relays, Consumers int
	// Rounds is how many times every fault kind is injected (zero: 1), in
	// random order, spread over WriteFor.
	Rounds int
	// DrainTimeout bounds the wait, after the faults, for every committed
	// row's effect and the redelivery of the last message of every
	// consumer the consumer_kill fault killed. Zero means 90s.
	DrainTimeout time.Duration
	// Seed seeds the schedule and the writers.
	Seed int64
	// Logger receives progress. Nil means slog.Default().
	Logger *slog.Logger
}

// FaultTally counts the injections of one fault kind and those of them the
// logs (or the databases) prove.
type FaultTally struct {
	Injected, Proven int
	// Evidence samples the proofs (a log line's gist, a measure);
	// Unproven says what was missing for each injection left unproven.
	Evidence, Unproven []string
}

// EffectsCell is the effects audit of one client in one run, read from its
// consumer database against the business rows of the outbox database.
type EffectsCell struct {
	Client string
	// Committed business rows; RolledBack rows the writers rolled back.
	Committed, RolledBack int
	// Effects applied in all.
	Effects int
	// Lost: committed rows without an effect. Duplicates: effects beyond
	// the first of a message. RolledBackApplied: effects of a rolled-back
	// row; Unknown: of a message that is no committed row (rolled back
	// ones included). Mismatched: effects whose key or sequence differ from
	// their row's. OrderViolations: per-key inversions of commit order in
	// the effects' order. WrongCounters: keys whose counter differs from
	// their committed rows.
	Lost, Duplicates, RolledBackApplied, Unknown, Mismatched, OrderViolations, WrongCounters int
	// Faults holds the client's own faults (consumer kill, rebalance,
	// consumer database kill, broker pause as this client saw it).
	Faults map[string]*FaultTally
}

// EffectsSummary is the verdict of one effects run.
type EffectsSummary struct {
	Dialect string
	// Mode is "default" or "fenced".
	Mode string
	// Written is the business rows written (committed or rolled back).
	Written int
	// Faults holds the faults of the relays, the outbox database and the
	// broker (as injected).
	Faults map[string]*FaultTally
	Cells  []EffectsCell
	// Drained: the outbox table emptied and every client applied an
	// effect for each committed row within DrainTimeout.
	Drained bool
	Took    time.Duration
}

// CellFaults returns every fault kind's tally as the cell saw it: the
// run's relay, outbox database and broker faults, and the cell's own.
func (s EffectsSummary) CellFaults(c EffectsCell) map[string]*FaultTally {
	out := map[string]*FaultTally{}
	for k, v := range s.Faults {
		out[k] = v
	}
	for k, v := range c.Faults {
		out[k] = v
	}
	return out
}

// Err reports the first failed check: a cell with a lost, duplicate,
// unknown, mismatched or out-of-order effect or a wrong counter, a fault
// kind never proven in a cell, or a run that did not drain.
func (s EffectsSummary) Err() error {
	var errs []error
	for _, c := range s.Cells {
		if n := c.Lost + c.Duplicates + c.RolledBackApplied + c.Unknown + c.Mismatched + c.OrderViolations + c.WrongCounters; n > 0 {
			errs = append(errs, fmt.Errorf("chaos: effects, %s mode, %s: %d lost, %d duplicates, %d of rolled-back rows, %d unknown, %d mismatched, %d order violations, %d wrong counters",
				s.Mode, c.Client, c.Lost, c.Duplicates, c.RolledBackApplied, c.Unknown, c.Mismatched, c.OrderViolations, c.WrongCounters))
		}
		fs := s.CellFaults(c)
		for _, k := range EffectsFaults() {
			if f := fs[k]; f == nil || f.Proven == 0 {
				inj := 0
				if f != nil {
					inj = f.Injected
				}
				errs = append(errs, fmt.Errorf("chaos: effects, %s mode, %s: fault %s injected %d times, never proven", s.Mode, c.Client, k, inj))
			}
		}
	}
	if !s.Drained {
		errs = append(errs, fmt.Errorf("chaos: effects, %s mode: not drained", s.Mode))
	}
	return errors.Join(errs...)
}

// String is the summary: one line per cell.
func (s EffectsSummary) String() string {
	var b strings.Builder
	for i, c := range s.Cells {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "effects: db=%s mode=%s client=%s written=%d committed=%d rolled_back=%d effects=%d lost=%d duplicates=%d rolled_back_applied=%d unknown=%d mismatched=%d order_violations=%d wrong_counters=%d drained=%t faults:",
			s.Dialect, s.Mode, c.Client, s.Written, c.Committed, c.RolledBack, c.Effects, c.Lost, c.Duplicates, c.RolledBackApplied, c.Unknown, c.Mismatched, c.OrderViolations, c.WrongCounters, s.Drained)
		fs := s.CellFaults(c)
		for _, k := range EffectsFaults() {
			f := fs[k]
			if f == nil {
				f = &FaultTally{}
			}
			fmt.Fprintf(&b, " %s=%d/%d", k, f.Proven, f.Injected)
		}
		fmt.Fprintf(&b, " took=%s", s.Took.Round(time.Second))
	}
	return b.String()
}

// Evidence returns the proofs of every fault kind as the cell saw them,
// one line per kind.
func (s EffectsSummary) Evidence(c EffectsCell) string {
	var b strings.Builder
	fs := s.CellFaults(c)
	for _, k := range EffectsFaults() {
		f := fs[k]
		if f == nil {
			continue
		}
		fmt.Fprintf(&b, "  %s (%d injected, %d proven): %s\n", k, f.Injected, f.Proven, strings.Join(f.Evidence, "; "))
		for _, u := range f.Unproven {
			fmt.Fprintf(&b, "    unproven: %s\n", u)
		}
	}
	return b.String()
}

func (f *FaultTally) prove(format string, args ...any) {
	f.Proven++
	if len(f.Evidence) < 3 {
		f.Evidence = append(f.Evidence, fmt.Sprintf(format, args...))
	}
}

func (f *FaultTally) note(format string, args ...any) {
	if len(f.Unproven) < 10 {
		f.Unproven = append(f.Unproven, fmt.Sprintf(format, args...))
	}
}

// order is a writer's business row, in the outbox database.
type order struct {
	ID        int64  `gorm:"primaryKey"`
	Key       string `gorm:"column:order_key;size:64;not null"`
	Seq       int    `gorm:"not null"`
	MessageID string `gorm:"column:message_id;size:36;not null"`
}

func (order) TableName() string { return "chaos_orders" }

// createConsumerDatabase creates a client's consumer database: the inbox
// table and the effect tables.
func createConsumerDatabase(ctx context.Context, dialect, base string) (*Database, error) {
	d, err := createDatabase(ctx, dialect, base, "", "outbox_chaos_c_", "consumer_", consumerAppName, []string{effectCounter{}.TableName()})
	if err != nil {
		return nil, err
	}
	db, err := Open(dialect, d.DSN, harnessAppName, 2)
	if err != nil {
		d.Drop(ctx)
		return nil, err
	}
	defer closeGorm(db)
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
		d.Drop(ctx)
		return nil, err
	}
	if err := db.AutoMigrate(&effect{}, &effectCounter{}); err != nil {
		d.Drop(ctx)
		return nil, fmt.Errorf("chaos: migrate the effect tables: %w", err)
	}
	return d, nil
}

// consumerGroup is one client's consumer processes.
type consumerGroup struct {
	client string
	base   ConsumerConfig
	bin    string
	dir    string
	d      *Database // the client's consumer database
	db     *gorm.DB  // the harness's connection to it
	cell   *EffectsCell

	mu      sync.Mutex
	live    []*Proc
	all     []*Proc
	next    int
	victims []*Proc  // killed by the inbox/after-commit failpoint
	leavers []leaver // stopped by a rebalance fault
	dbKills []DBKill // of the consumer database
}

// leaver is a member a rebalance fault stopped, and when.
type leaver struct {
	p    *Proc
	left time.Time
}

func (g *consumerGroup) start(env ...string) (*Proc, error) {
	g.mu.Lock()
	g.next++
	id := fmt.Sprintf("%s-%d", g.client, g.next)
	g.mu.Unlock()
	c := g.base
	c.ID = id
	p, err := startProcess(g.bin, c.Args(), env, filepath.Join(g.dir, "consumer-"+id+".log"))
	if err != nil {
		return nil, fmt.Errorf("chaos: start consumer %s: %w", id, err)
	}
	p.ID = id
	g.mu.Lock()
	g.all = append(g.all, p)
	g.mu.Unlock()
	return p, nil
}

func (g *consumerGroup) add(env ...string) (*Proc, error) {
	p, err := g.start(env...)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.live = append(g.live, p)
	g.mu.Unlock()
	return p, nil
}

// take removes a random live member from the group's pool (the groups'
// faults run at once: math/rand's goroutine-safe source).
func (g *consumerGroup) take() *Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.live) == 0 {
		return nil
	}
	i := rand.IntN(len(g.live))
	p := g.live[i]
	g.live = append(g.live[:i], g.live[i+1:]...)
	return p
}

func (g *consumerGroup) stopAll() {
	g.mu.Lock()
	ps := append([]*Proc(nil), g.all...)
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(15 * time.Second)
		}()
	}
	wg.Wait()
}

// procs returns every process the group started.
func (g *consumerGroup) procs() []*Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Proc(nil), g.all...)
}

// logs returns the group's log files.
func (g *consumerGroup) logs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var fs []string
	for _, p := range g.all {
		fs = append(fs, p.Log)
	}
	return fs
}

// RunEffects performs one effects run and returns its summary; the error
// is a setup failure (see EffectsSummary.Err for the checks).
func RunEffects(ctx context.Context, cfg EffectsConfig) (EffectsSummary, error) {
	start := time.Now()
	if cfg.Clients == nil {
		cfg.Clients = Clients()
	}
	if cfg.Messages == 0 {
		cfg.Messages = 4000
	}
	if cfg.WriteFor == 0 {
		cfg.WriteFor = 45 * time.Second
	}
	if cfg.Keys == 0 {
		cfg.Keys = 32
	}
	if cfg.Relays == 0 {
		cfg.Relays = 3
	}
	if cfg.Consumers == 0 {
		cfg.Consumers = 2
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 1
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 90 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	s := EffectsSummary{Dialect: cfg.Dialect, Mode: "default", Faults: map[string]*FaultTally{}}
	if cfg.Transactional {
		s.Mode = "fenced"
	}
	// The children's logs, apart from any other run's in cfg.Dir.
	dir, err := os.MkdirTemp(cfg.Dir, "effects-"+s.Mode+"-")
	if err != nil {
		return s, fmt.Errorf("chaos: log directory: %w", err)
	}
	cfg.Dir = dir
	for _, k := range []string{FaultRelayKill, FaultRelayPause, FaultZombie, FaultBrokerPause, FaultOutboxDBKill} {
		s.Faults[k] = &FaultTally{}
	}
	switch {
	case cfg.Dialect != Postgres && cfg.Dialect != MySQL:
		return s, fmt.Errorf("chaos: the effects run needs postgres or mysql, not %q", cfg.Dialect)
	case len(cfg.Brokers) == 0:
		return s, errors.New("chaos: the effects run needs a real broker")
	case cfg.BrokerPID <= 0:
		return s, errors.New("chaos: the effects run needs the broker's process id (EffectsConfig.BrokerPID) to pause it")
	}

	d, err := CreateDatabase(ctx, cfg.Dialect, cfg.BaseDSN, cfg.Dir)
	if err != nil {
		return s, err
	}
	defer d.Drop(ctx)
	db, err := Open(cfg.Dialect, d.DSN, harnessAppName, writers+4)
	if err != nil {
		return s, err
	}
	defer closeGorm(db)
	if err := db.Use(outbox.Plugin{}); err != nil {
		return s, err
	}
	if err := db.AutoMigrate(&order{}); err != nil {
		return s, fmt.Errorf("chaos: migrate the business table: %w", err)
	}
	topic := unique("chaos_effects_")
	if err := CreateTopic(ctx, cfg.Brokers, topic, partitions); err != nil {
		return s, err
	}

	// Each client's consumer database and group.
	var groups []*consumerGroup
	defer func() {
		for _, g := range groups {
			g.stopAll()
			closeGorm(g.db)
			g.d.Drop(ctx)
		}
	}()
	for _, client := range cfg.Clients {
		cd, err := createConsumerDatabase(ctx, cfg.Dialect, cfg.BaseDSN)
		if err != nil {
			return s, err
		}
		cdb, err := Open(cfg.Dialect, cd.DSN, harnessAppName, 2)
		if err != nil {
			cd.Drop(ctx)
			return s, err
		}
		g := &consumerGroup{
			client: client, bin: cfg.Bin, dir: cfg.Dir, d: cd, db: cdb,
			base: ConsumerConfig{Client: client, Dialect: cfg.Dialect, DSN: cd.RelayDSN, Brokers: cfg.Brokers, Group: unique("chaos-effects-" + client + "-"), Topic: topic},
			cell: &EffectsCell{Client: client, Faults: map[string]*FaultTally{FaultConsumerKill: {}, FaultRebalance: {}, FaultBrokerPause: {}, FaultConsumerDBKill: {}}},
		}
		groups = append(groups, g)
		for range cfg.Consumers {
			if _, err := g.add(); err != nil {
				return s, err
			}
		}
	}

	relays := &Relays{Bin: cfg.Bin, LogDir: cfg.Dir, Base: RelayConfig{
		Dialect: cfg.Dialect, DSN: d.RelayDSN, Brokers: cfg.Brokers,
		LeaseDuration: leaseDuration, RenewInterval: renewInterval, PollInterval: pollInterval, BatchSize: batchSize,
		PublishTimeout: effectsPubTTL, TxnOutbox: txnOutbox(cfg.Transactional, topic),
	}}
	defer relays.StopAll(10 * time.Second)
	pool := &relayPool{relays: relays}
	for range cfg.Relays {
		if err := pool.add(); err != nil {
			return s, err
		}
	}

	// Writers.
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0xeffec7))
	stopWriters := make(chan struct{})
	var (
		wmu        sync.Mutex
		written    int
		rolledBack = map[string]bool{}
		writeErr   error
		wwg        sync.WaitGroup
	)
	for w := range writers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			n, rb, err := writeOrders(ctx, db, topic, w, cfg, stopWriters)
			wmu.Lock()
			defer wmu.Unlock()
			written += n
			for id := range rb {
				rolledBack[id] = true
			}
			writeErr = errors.Join(writeErr, err)
		}()
	}
	writersDone := make(chan struct{})
	go func() { wwg.Wait(); close(writersDone) }()
	writeUntil := time.Now().Add(cfg.WriteFor)

	// Faults: every kind once per round, shuffled within the round.
	var schedule []string
	for range cfg.Rounds {
		round := EffectsFaults()
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		schedule = append(schedule, round...)
	}
	interval := cfg.WriteFor / time.Duration(len(schedule)+1)
	h := &effectsHarness{cfg: cfg, log: log, rng: rng, d: d, db: db, pool: pool, groups: groups, s: &s}
	next := time.Now().Add(interval)
	for _, kind := range schedule {
		if wait := time.Until(next); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		next = time.Now().Add(interval)
		log.Info("chaos: effects fault", "kind", kind, "mode", s.Mode)
		if err := h.inject(ctx, kind); err != nil {
			log.Warn("chaos: effects fault failed", "kind", kind, "error", err)
		}
	}
	if wait := time.Until(writeUntil); wait > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	close(stopWriters)
	<-writersDone // they stop at once (or at ctx's end)
	if writeErr != nil {
		return s, writeErr
	}
	s.Written = written
	log.Info("chaos: effects faults over; draining", "mode", s.Mode, "written", written)

	// Drain: the outbox table empties, each client applies an effect for
	// every committed row, and the last message of each consumer the
	// consumer_kill fault killed is redelivered (its proof).
	var committed int64
	if err := db.Model(&order{}).Count(&committed).Error; err != nil {
		return s, fmt.Errorf("chaos: count business rows: %w", err)
	}
	deadline := time.Now().Add(cfg.DrainTimeout)
	for ctx.Err() == nil {
		drained, redelivered := true, true
		var n int64
		if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil || n > 0 {
			drained = false
		}
		for _, g := range groups {
			var ids int64
			if err := g.db.Model(&effect{}).Distinct("message_id").Count(&ids).Error; err != nil || ids < committed {
				drained = false
			}
			redelivered = redelivered && g.redelivered()
		}
		s.Drained = drained
		if drained && redelivered {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(time.Second) // room for a late duplicate effect
	for _, g := range groups {
		g.stopAll()
	}
	relays.StopAll(10 * time.Second)

	// The audit and the proofs that need the whole logs.
	for _, g := range groups {
		if err := auditEffects(db, g.db, rolledBack, g.cell); err != nil {
			return s, err
		}
		if err := proveConsumerFaults(g); err != nil {
			return s, err
		}
		s.Cells = append(s.Cells, *g.cell)
	}
	if err := h.proveRelayFaults(); err != nil {
		return s, err
	}
	s.Took = time.Since(start)
	return s, ctx.Err()
}

// writeOrders is one writer: it owns every key k with k % writers == w (its
// writes to a key are serialised, so a key's sequence numbers are its
// commit order) and commits or rolls back transactions of 1 to 3 business
// rows, each with its outbox message (value: the row's sequence number),
// at the rate of its share of cfg.Messages over cfg.WriteFor, until stop
// is closed. It returns the rows written and the message ids of the
// rolled-back ones.
func writeOrders(ctx context.Context, db *gorm.DB, topic string, w int, cfg EffectsConfig, stop <-chan struct{}) (int, map[string]bool, error) {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w)+1))
	var keys []string
	for k := w; k < cfg.Keys; k += writers {
		keys = append(keys, fmt.Sprintf("k%02d", k))
	}
	rolledBack := map[string]bool{}
	if len(keys) == 0 {
		return 0, rolledBack, nil
	}
	share := max(cfg.Messages/writers, 1)
	seq := map[string]int{}
	start := time.Now()
	written := 0
	for ctx.Err() == nil {
		due := time.Duration(float64(cfg.WriteFor) * float64(written) / float64(share))
		if el := time.Since(start); el < due {
			select {
			case <-stop:
				return written, rolledBack, nil
			case <-time.After(due - el):
			}
		}
		select {
		case <-stop:
			return written, rolledBack, nil
		default:
		}
		n := 1 + rng.IntN(3)
		msgs := make([]*outbox.Message, n)
		rows := make([]order, n)
		for i := range msgs {
			k := keys[rng.IntN(len(keys))]
			seq[k]++
			msgs[i] = outbox.NewStringMessage(topic, k, strconv.Itoa(seq[k]))
			rows[i] = order{Key: k, Seq: seq[k]}
		}
		rollback := rng.Float64() < rollbackChance
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := outbox.Enqueue(tx, msgs...); err != nil {
				return err
			}
			for i := range rows {
				rows[i].MessageID = msgs[i].MessageID.String()
			}
			if err := tx.Create(&rows).Error; err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		switch {
		case errors.Is(err, errRollback):
			for _, m := range msgs {
				rolledBack[m.MessageID.String()] = true
			}
		case err != nil:
			if ctx.Err() != nil {
				return written, rolledBack, nil
			}
			// The writers' sessions are never killed: a failed commit is
			// the harness's problem, not a fault under test.
			return written, rolledBack, fmt.Errorf("chaos: writer %d: %w", w, err)
		}
		written += n
	}
	return written, rolledBack, nil
}

var errRollback = errors.New("chaos: rolled back on purpose")

// auditEffects fills cell's audit: the committed business rows of the
// outbox database against the effects in the client's database.
func auditEffects(odb, cdb *gorm.DB, rolledBack map[string]bool, cell *EffectsCell) error {
	var rows []order
	if err := odb.Find(&rows).Error; err != nil {
		return fmt.Errorf("chaos: read business rows: %w", err)
	}
	byID := make(map[string]order, len(rows))
	perKey := map[string]int{}
	for _, r := range rows {
		byID[r.MessageID] = r
		perKey[r.Key]++
	}
	var effects []effect
	if err := cdb.Order("id").Find(&effects).Error; err != nil {
		return fmt.Errorf("chaos: read effects: %w", err)
	}
	cell.Committed, cell.RolledBack, cell.Effects = len(rows), len(rolledBack), len(effects)
	seen := map[string]bool{}
	last := map[string]int{}
	for _, e := range effects {
		if seen[e.MessageID] {
			cell.Duplicates++
			continue
		}
		seen[e.MessageID] = true
		r, ok := byID[e.MessageID]
		switch {
		case !ok:
			cell.Unknown++
			if rolledBack[e.MessageID] {
				cell.RolledBackApplied++
			}
			continue
		case r.Key != e.Key || r.Seq != e.Seq:
			cell.Mismatched++
		}
		if l, ok := last[e.Key]; ok && e.Seq < l {
			cell.OrderViolations++
		}
		last[e.Key] = e.Seq
	}
	for id := range byID {
		if !seen[id] {
			cell.Lost++
		}
	}
	var counters []effectCounter
	if err := cdb.Find(&counters).Error; err != nil {
		return fmt.Errorf("chaos: read counters: %w", err)
	}
	got := map[string]int{}
	for _, c := range counters {
		got[c.Key] = c.N
	}
	for k, n := range perKey {
		if got[k] != n {
			cell.WrongCounters++
		}
		delete(got, k)
	}
	cell.WrongCounters += len(got) // keys with no committed row
	return nil
}

// effectsHarness injects the faults of one effects run.
type effectsHarness struct {
	cfg    EffectsConfig
	log    *slog.Logger
	rng    *rand.Rand
	d      *Database
	db     *gorm.DB
	pool   *relayPool
	groups []*consumerGroup
	s      *EffectsSummary

	dbKills []DBKill // outbox database kills, for their proof
	pauses  []window // broker pauses
}

type window struct{ from, to time.Time }

func (h *effectsHarness) inject(ctx context.Context, kind string) error {
	switch kind {
	case FaultRelayKill:
		return h.relayKill()
	case FaultRelayPause:
		return h.relayPause(ctx)
	case FaultZombie:
		return h.zombie(ctx)
	case FaultConsumerKill:
		return h.eachGroup(func(g *consumerGroup) error { return h.consumerKill(ctx, g) })
	case FaultRebalance:
		return h.eachGroup(func(g *consumerGroup) error { return h.rebalance(g) })
	case FaultBrokerPause:
		return h.brokerPause(ctx)
	case FaultOutboxDBKill:
		k, err := h.d.KillClientSessions(ctx)
		if err != nil {
			return err
		}
		h.s.Faults[kind].Injected++
		h.dbKills = append(h.dbKills, k)
		h.log.Info("chaos: killed the relays' database sessions", "sessions", k.Killed, "mid_statement", k.MidStatement, "blocked", k.Blocked, "waited", k.Waited)
		return nil
	case FaultConsumerDBKill:
		return h.eachGroup(func(g *consumerGroup) error { return h.consumerDBKill(ctx, g) })
	}
	return fmt.Errorf("chaos: unknown fault %q", kind)
}

// eachGroup runs f for every consumer group at once.
func (h *effectsHarness) eachGroup(f func(g *consumerGroup) error) error {
	errs := make([]error, len(h.groups))
	var wg sync.WaitGroup
	for i, g := range h.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(g); err != nil {
				errs[i] = fmt.Errorf("%s: %w", g.client, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *effectsHarness) relayKill() error {
	p := h.pool.take(h.rng)
	if p == nil {
		return errors.New("no live relay")
	}
	f := h.s.Faults[FaultRelayKill]
	p.Signal(syscall.SIGKILL)
	<-p.Done()
	f.Injected++
	if sig := p.ExitSignal(); sig == syscall.SIGKILL {
		f.prove("%s exited by %v", p.ID, sig)
	} else {
		f.note("%s exited with %v", p.ID, p.Err)
	}
	return h.pool.add()
}

// owners returns the live owner of each bucket (bucket → relay id).
func (h *effectsHarness) owners() (map[int]string, error) {
	var leases []outbox.BucketLease
	if err := h.db.Where("owner IS NOT NULL AND expires_at_ms > ?", time.Now().UnixMilli()).Find(&leases).Error; err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, l := range leases {
		if l.Owner != nil {
			out[int(l.Bucket)] = *l.Owner
		}
	}
	return out, nil
}

// takeOwner takes a live relay that owns a bucket from the pool.
func (h *effectsHarness) takeOwner() *Proc {
	own, err := h.owners()
	if err != nil {
		return nil
	}
	ids := map[string]bool{}
	for _, id := range own {
		ids[id] = true
	}
	h.pool.mu.Lock()
	defer h.pool.mu.Unlock()
	for i, p := range h.pool.live {
		if ids[p.ID] {
			h.pool.live = append(h.pool.live[:i], h.pool.live[i+1:]...)
			return p
		}
	}
	return nil
}

// takenFrom reports whether the lease audit recorded a bucket moving from
// id to another relay at or after since (database clock, Unix ms).
func (h *effectsHarness) takenFrom(id string, since int64) (bool, error) {
	var n int64
	err := h.db.Raw("SELECT COUNT(*) FROM chaos_lease_audit WHERE old_owner = ? AND new_owner IS NOT NULL AND new_owner <> ? AND at_ms >= ?", id, id, since).Scan(&n).Error
	return n > 0, err
}

func (h *effectsHarness) relayPause(ctx context.Context) error {
	p := h.takeOwner()
	if p == nil {
		return errors.New("no live relay owns a bucket")
	}
	f := h.s.Faults[FaultRelayPause]
	since := time.Now().UnixMilli()
	p.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	f.Injected++
	taken := false
	for end := stopped.Add(leaseDuration + 5*time.Second); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		if ok, err := h.takenFrom(p.ID, since); err == nil && ok {
			taken = true
			time.Sleep(time.Second) // the peer publishes from the bucket meanwhile
			break
		}
	}
	p.Signal(syscall.SIGCONT)
	if taken {
		f.prove("%s stopped %.1fs; a peer took a bucket of its (lease %v)", p.ID, time.Since(stopped).Seconds(), leaseDuration)
	} else {
		f.note("%s stopped %.1fs; no takeover seen", p.ID, time.Since(stopped).Seconds())
	}
	h.pool.give(p)
	return nil
}

// zombie starts a relay armed to stop itself between its produce and its
// commit, waits until it stopped, until peers own all its buckets and have
// published and deleted rows newer than its batch, then resumes it.
func (h *effectsHarness) zombie(ctx context.Context) error {
	fp := "relay/during-publish"
	if h.cfg.Transactional {
		fp = "kafkapub/before-commit"
	}
	p, err := h.pool.start("zombie", "OUTBOX_FAILPOINTS="+fp+"=stop@2")
	if err != nil {
		return err
	}
	f := h.s.Faults[FaultZombie]
	defer p.Stop(10 * time.Second) // an extra relay: the pool keeps its size
	if !waitForLine(ctx, p.Log, "failpoint "+fp+": SIGSTOP", 30*time.Second) {
		return fmt.Errorf("%s: the failpoint %s never fired", p.ID, fp)
	}
	stoppedAt := time.Now()
	f.Injected++
	defer p.Signal(syscall.SIGCONT)
	var buckets []int
	if err := h.db.Model(&outbox.BucketLease{}).Where("owner = ?", p.ID).Pluck("bucket", &buckets).Error; err != nil {
		return err
	}
	var m int64
	if err := h.db.Model(&outbox.Message{}).Select("COALESCE(MAX(id), 0)").Scan(&m).Error; err != nil {
		return err
	}
	progressed := false
	var newer int64
	deadline := stoppedAt.Add(zombieWait)
	for time.Now().Before(deadline) && ctx.Err() == nil && len(buckets) > 0 {
		own, err := h.owners()
		if err == nil && peersOwn(own, buckets, p.ID) {
			// Rows newer than the zombie's batch, committed now, in its buckets:
			// once none of them is left, a peer has published them.
			var m2 int64
			if err := h.db.Model(&outbox.Message{}).Select("COALESCE(MAX(id), 0)").Scan(&m2).Error; err != nil {
				return err
			}
			if err := h.db.Model(&outbox.Message{}).Where("bucket IN ? AND id > ? AND id <= ?", buckets, m, m2).Count(&newer).Error; err != nil {
				return err
			}
			if newer > 0 {
				for time.Now().Before(deadline) && ctx.Err() == nil {
					var left int64
					if err := h.db.Model(&outbox.Message{}).Where("bucket IN ? AND id <= ?", buckets, m2).Count(&left).Error; err == nil && left == 0 {
						progressed = true
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Signal(syscall.SIGCONT)
	resumed := time.Now()
	h.log.Info("chaos: zombie resumed", "relay", p.ID, "buckets", buckets, "stopped", resumed.Sub(stoppedAt).Round(time.Millisecond), "peers_published_newer_rows", progressed, "newer_rows", newer)
	if !progressed {
		f.note("%s stopped %.1fs at %s (buckets %v); peers did not publish newer rows meanwhile", p.ID, resumed.Sub(stoppedAt).Seconds(), fp, buckets)
		return nil
	}
	if !h.cfg.Transactional {
		f.prove("%s stopped %.1fs at %s with its records appended; peers published %d newer rows of its buckets %v meanwhile", p.ID, resumed.Sub(stoppedAt).Seconds(), fp, newer, buckets)
		return nil
	}
	// Fenced mode: its commit must be refused.
	if line, ok := waitForMatch(ctx, p.Log, func(l string) bool {
		return strings.Contains(l, `msg="`+logFenced+`"`) && strings.Contains(l, "EndTxn (commit)")
	}, 15*time.Second); ok {
		f.prove("%s stopped %.1fs at %s; peers published %d newer rows of buckets %v; then its commit was refused: %s", p.ID, resumed.Sub(stoppedAt).Seconds(), fp, newer, buckets, gist(line, "error="))
	} else {
		f.note("%s: no refused EndTxn (commit) in its log", p.ID)
	}
	return nil
}

// peersOwn reports whether every bucket of buckets has a live owner other
// than id.
func peersOwn(own map[int]string, buckets []int, id string) bool {
	for _, b := range buckets {
		if o, ok := own[b]; !ok || o == id {
			return false
		}
	}
	return true
}

// consumerKill starts an extra member armed to SIGKILL itself after its
// k-th processed message's commit and waits for its death. The proof (its
// last effect redelivered and skipped) comes at the end
// (proveConsumerFaults).
func (h *effectsHarness) consumerKill(ctx context.Context, g *consumerGroup) error {
	k := 10 + rand.IntN(30)
	p, err := g.start(fmt.Sprintf("OUTBOX_FAILPOINTS=inbox/after-commit=kill@%d", k))
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-time.After(60 * time.Second):
		p.Signal(syscall.SIGKILL)
		<-p.Done()
		return fmt.Errorf("%s never reached its %d-th commit", p.ID, k)
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.ExitSignal() == syscall.SIGKILL && fileContains(p.Log, "failpoint inbox/after-commit: SIGKILL") {
		g.cell.Faults[FaultConsumerKill].Injected++
		g.mu.Lock()
		g.victims = append(g.victims, p)
		g.mu.Unlock()
	}
	return nil // the victim was an extra member: the group is back to its size
}

// rebalance stops a member gracefully (it leaves the group) and starts a
// new one.
func (h *effectsHarness) rebalance(g *consumerGroup) error {
	p := g.take()
	if p == nil {
		return errors.New("no live consumer")
	}
	left := time.Now()
	p.Stop(15 * time.Second)
	g.cell.Faults[FaultRebalance].Injected++
	g.mu.Lock()
	g.leavers = append(g.leavers, leaver{p, left})
	g.mu.Unlock()
	_, err := g.add()
	return err
}

func (h *effectsHarness) brokerPause(ctx context.Context) error {
	if err := syscall.Kill(h.cfg.BrokerPID, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP the broker (%d): %w", h.cfg.BrokerPID, err)
	}
	from := time.Now()
	h.s.Faults[FaultBrokerPause].Injected++
	select {
	case <-ctx.Done():
	case <-time.After(brokerPause):
	}
	if err := syscall.Kill(h.cfg.BrokerPID, syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT the broker (%d): %w", h.cfg.BrokerPID, err)
	}
	w := window{from, time.Now()}
	h.pauses = append(h.pauses, w)
	h.s.Faults[FaultBrokerPause].prove("broker %d stopped %.1fs", h.cfg.BrokerPID, w.to.Sub(w.from).Seconds())
	for _, g := range h.groups {
		g.cell.Faults[FaultBrokerPause].Injected++
	}
	return nil
}

// consumerDBKill kills the consumers' sessions of g's database until a
// kill lands mid-transaction (a consumer blocked on the lock; a group that
// is rebalancing handles nothing), at most consumerDBKillTries times. The
// proof comes at the end (proveConsumerFaults).
func (h *effectsHarness) consumerDBKill(ctx context.Context, g *consumerGroup) error {
	g.cell.Faults[FaultConsumerDBKill].Injected++
	for try := 1; ; try++ {
		k, err := g.d.KillClientSessions(ctx)
		if err != nil {
			return err
		}
		h.log.Info("chaos: killed the consumers' database sessions", "client", g.client, "sessions", k.Killed, "mid_statement", k.MidStatement, "blocked", k.Blocked, "waited", k.Waited, "try", try)
		g.mu.Lock()
		g.dbKills = append(g.dbKills, k)
		g.mu.Unlock()
		if k.MidStatement > 0 || try == consumerDBKillTries || ctx.Err() != nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// consumerDBKillTries bounds the kills of one consumer database kill
// fault.
const consumerDBKillTries = 8

// proveConsumerFaults proves g's faults from the whole logs: each consumer
// kill (the message of the victim's last effect, its transaction committed
// and its offset not, was redelivered to another member and skipped as a
// duplicate), each rebalance (another member logged a new assignment after
// the leave) and each consumer database kill (mid-transaction, and a
// consumer logged a failed handling within dbKillEcho).
func proveConsumerFaults(g *consumerGroup) error {
	rf := g.cell.Faults[FaultRebalance]
	for _, l := range g.leavers {
		found := ""
		for _, p := range g.procs() {
			// A member that was there before the leave.
			if p == l.p || !p.StartedAt.Before(l.left) {
				continue
			}
			file := p.Log
			// Its client logs each generation's assignment (franz-go's
			// cooperative rebalance may assign a member nothing new: the
			// callback still runs, with no partition).
			if line, ok := firstLine(file, func(s string) bool {
				at, ok := lineTime(s)
				return ok && at.After(l.left) && strings.Contains(s, `msg="`+logAssigned+`"`)
			}); ok {
				found = line
				break
			}
		}
		if found != "" {
			rf.prove("%s left; a member that stayed: %s", l.p.ID, gist(found, "consumer="))
		} else {
			rf.note("%s left; no member that stayed logged a new assignment", l.p.ID)
		}
	}
	df := g.cell.Faults[FaultConsumerDBKill]
	for _, k := range g.dbKills {
		if k.MidStatement == 0 {
			continue
		}
		found := ""
		for _, file := range g.logs() {
			if line, ok := lineWithin(file, `msg="`+logHandlingFailed+`"`, k.At, k.At.Add(k.Took+dbKillEcho)); ok {
				found = line
				break
			}
		}
		if found != "" {
			df.prove("%d sessions killed, %d mid-transaction; %s", k.Killed, k.MidStatement, gist(found, "error="))
		} else {
			df.note("%d sessions killed, %d mid-statement; no consumer WARN within %v", k.Killed, k.MidStatement, dbKillEcho)
		}
	}
	if df.Injected > 0 && df.Proven == 0 && len(df.Unproven) == 0 {
		df.note("%d kills, none mid-transaction", len(g.dbKills))
	}
	f := g.cell.Faults[FaultConsumerKill]
	for _, v := range g.killed() {
		e, found, err := g.redelivery(v)
		if err != nil {
			return err
		}
		if e.MessageID == "" {
			f.note("%s applied no effect", v.ID)
			continue
		}
		if found == "" {
			f.note("%s killed after committing %s[%d]@%d; its redelivery never seen", v.ID, e.Key, e.Part, e.At)
			continue
		}
		f.prove("%s killed after committing message %s (key %s, partition %d, offset %d); redelivered and skipped: %s", v.ID, e.MessageID, e.Key, e.Part, e.At, gist(found, "consumer="))
	}
	return nil
}

// killed returns the members the consumer_kill fault killed.
func (g *consumerGroup) killed() []*Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.victims)
}

// redelivery returns v's last effect (MessageID "" when it applied none)
// and the line of another member of g that skipped that effect's message as
// a duplicate: its redelivery ("" while none has).
func (g *consumerGroup) redelivery(v *Proc) (effect, string, error) {
	var e effect
	if err := g.db.Where("consumer = ?", v.ID).Order("id DESC").Limit(1).Find(&e).Error; err != nil {
		return e, "", fmt.Errorf("chaos: read %s's last effect: %w", v.ID, err)
	}
	if e.MessageID == "" {
		return e, "", nil
	}
	for _, file := range g.logs() {
		if file == v.Log {
			continue
		}
		if line, ok := firstLine(file, func(l string) bool {
			return strings.Contains(l, `msg="`+logDuplicate+`"`) && strings.Contains(l, "message_id="+e.MessageID)
		}); ok {
			return e, line, nil
		}
	}
	return e, "", nil
}

// redelivered reports whether the last effect of every member the
// consumer_kill fault killed has been redelivered to another member: a
// member killed moments before the drain holds its partitions until its
// session times out, and only then do they move.
func (g *consumerGroup) redelivered() bool {
	for _, v := range g.killed() {
		e, found, err := g.redelivery(v)
		if err != nil || (e.MessageID != "" && found == "") {
			return false
		}
	}
	return true
}

// proveRelayFaults proves the outbox database kills (mid-statement, and a
// relay's store WARN within dbKillEcho) and, per client, the broker pauses
// (a gap in the effects applied overlapping the pause).
func (h *effectsHarness) proveRelayFaults() error {
	warns, err := storeWarnings(h.cfg.Dir)
	if err != nil {
		return err
	}
	f := h.s.Faults[FaultOutboxDBKill]
	for _, k := range h.dbKills {
		n := 0
		for _, at := range warns {
			if !at.Before(k.At) && at.Before(k.At.Add(k.Took+dbKillEcho)) {
				n++
			}
		}
		if k.MidStatement > 0 && n > 0 {
			f.prove("%d relay sessions killed, %d mid-statement; %d relay store WARNs", k.Killed, k.MidStatement, n)
		} else {
			f.note("%d relay sessions killed, %d mid-statement; %d relay store WARNs", k.Killed, k.MidStatement, n)
		}
	}
	for _, g := range h.groups {
		f := g.cell.Faults[FaultBrokerPause]
		for _, w := range h.pauses {
			gap, err := effectGap(g.db, w)
			if err != nil {
				return err
			}
			if d := w.to.Sub(w.from); gap >= d/2 {
				f.prove("no effect applied for %.1fs during a %.1fs pause", gap.Seconds(), d.Seconds())
			} else {
				f.note("longest gap %.1fs during a %.1fs pause", gap.Seconds(), d.Seconds())
			}
		}
	}
	return nil
}

// effectGap returns the longest interval without an effect applied that
// overlaps w.
func effectGap(db *gorm.DB, w window) (time.Duration, error) {
	var ats []int64
	from, to := w.from.Add(-30*time.Second).UnixMilli(), w.to.Add(30*time.Second).UnixMilli()
	if err := db.Model(&effect{}).Where("applied_at_ms BETWEEN ? AND ?", from, to).Order("applied_at_ms").Pluck("applied_at_ms", &ats).Error; err != nil {
		return 0, fmt.Errorf("chaos: read effect times: %w", err)
	}
	ats = append([]int64{from}, append(ats, to)...)
	var best int64
	for i := 1; i < len(ats); i++ {
		a, b := ats[i-1], ats[i]
		if b < w.from.UnixMilli() || a > w.to.UnixMilli() {
			continue
		}
		// The part of the gap that overlaps the pause.
		a, b = max(a, w.from.UnixMilli()), min(b, w.to.UnixMilli())
		best = max(best, b-a)
	}
	return time.Duration(best) * time.Millisecond, nil
}

// ServicesBrokerPID returns the pid of the real broker's JVM from the pid
// file scripts/services.sh writes ($OUTBOX_SERVICES_DIR/kafka/kafka.pid,
// by default under /tmp/gorm-outbox-services), checking that it runs.
func ServicesBrokerPID() (int, error) {
	dir := os.Getenv("OUTBOX_SERVICES_DIR")
	if dir == "" {
		dir = "/tmp/gorm-outbox-services"
	}
	file := filepath.Join(dir, "kafka", "kafka.pid")
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("chaos: no pid file of the real broker: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("chaos: pid file %s holds no pid (%q)", file, b)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, fmt.Errorf("chaos: the real broker's process %d (from %s) is not running: %w", pid, file, err)
	}
	return pid, nil
}

// Log reading. The children log with slog's text handler: each line starts
// with time=RFC3339Nano.

func readLines(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	return strings.Split(string(b), "\n")
}

func lineTime(l string) (time.Time, bool) {
	if !strings.HasPrefix(l, "time=") {
		return time.Time{}, false
	}
	ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
	t, err := time.Parse(time.RFC3339Nano, ts)
	return t, err == nil
}

func firstLine(file string, match func(string) bool) (string, bool) {
	for _, l := range readLines(file) {
		if match(l) {
			return l, true
		}
	}
	return "", false
}

func fileContains(file, s string) bool {
	_, ok := firstLine(file, func(l string) bool { return strings.Contains(l, s) })
	return ok
}

// lineWithin returns the first line holding s logged in [from, to).
func lineWithin(file, s string, from, to time.Time) (string, bool) {
	return firstLine(file, func(l string) bool {
		at, ok := lineTime(l)
		return ok && !at.Before(from) && at.Before(to) && strings.Contains(l, s)
	})
}

func waitForLine(ctx context.Context, file, s string, timeout time.Duration) bool {
	_, ok := waitForMatch(ctx, file, func(l string) bool { return strings.Contains(l, s) }, timeout)
	return ok
}

func waitForMatch(ctx context.Context, file string, match func(string) bool, timeout time.Duration) (string, bool) {
	for end := time.Now().Add(timeout); ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		if l, ok := firstLine(file, match); ok {
			return l, true
		}
		if time.Now().After(end) {
			break
		}
	}
	return "", false
}

// gist returns l from its first from on, at most 200 bytes.
func gist(l, from string) string {
	if i := strings.Index(l, from); i >= 0 {
		l = l[i:]
	}
	if len(l) > 200 {
		l = l[:200] + "…"
	}
	return l
}

// FormatEffects renders summaries as a Markdown table: one row per cell.
func FormatEffects(ss []EffectsSummary) string {
	var b strings.Builder
	b.WriteString("| database | relay mode | consumer | committed | rolled back | effects | lost | duplicates | order violations | wrong counters | faults proven/injected | took |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, s := range ss {
		for _, c := range s.Cells {
			fs := s.CellFaults(c)
			var parts []string
			for _, k := range EffectsFaults() {
				f := fs[k]
				if f == nil {
					f = &FaultTally{}
				}
				parts = append(parts, fmt.Sprintf("%s %d/%d", k, f.Proven, f.Injected))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", s.Dialect, s.Mode, c.Client, c.Committed, c.RolledBack, c.Effects,
				c.Lost, c.Duplicates, c.OrderViolations, c.WrongCounters, strings.Join(parts, ", "), s.Took.Round(time.Second))
		}
	}
	return b.String()
}
