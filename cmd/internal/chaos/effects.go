package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// The effects run (RunEffects) audits what users see, the consumers'
// databases: writers commit business rows with their outbox messages, relay
// processes publish them, and consumer processes of each client apply one
// effect per message in their own database, under every fault below. Each
// fault is proven from what the processes logged or wrote (CHAOS.md).
const (
	FaultRelayKill      = "relay_kill"       // SIGKILL a relay, start a replacement
	FaultRelayPause     = "relay_pause"      // SIGSTOP a relay that owns buckets until a peer took one
	FaultZombie         = "zombie"           // a relay stopped between its produce and its commit, resumed once peers moved on
	FaultConsumerKill   = "consumer_kill"    // a consumer SIGKILLed after a commit, before its offset commit
	FaultRebalance      = "rebalance"        // a consumer leaves its group (SIGTERM), a new one joins
	FaultBrokerPause    = "broker_pause"     // SIGSTOP the broker's JVM for brokerPause
	FaultOutboxDBKill   = "outbox_db_kill"   // kill the relays' sessions, one mid-statement
	FaultConsumerDBKill = "consumer_db_kill" // kill the consumers' sessions, one inside its transaction
)

// EffectsFaults returns the fault kinds of the effects run, in the order
// the summary lists them.
func EffectsFaults() []string {
	return []string{FaultRelayKill, FaultRelayPause, FaultZombie, FaultConsumerKill, FaultRebalance, FaultBrokerPause, FaultOutboxDBKill, FaultConsumerDBKill}
}

// The effects run's keys, relays and members of each consumer group, and
// the timing of its faults.
const (
	effectsKeys      = 32
	effectsRelays    = 3
	effectsConsumers = 2

	brokerPause   = 6 * time.Second  // a broker pause
	zombieWait    = 25 * time.Second // the longest a zombie stays stopped
	effectsPubTTL = 30 * time.Second // the relays' PublishTimeout: longer than zombieWait, so that the zombie's EndTxn is sent
)

// EffectsConfig configures RunEffects. Zero sizes take the defaults named.
type EffectsConfig struct {
	Env // Dialect postgres or mysql, for the outbox database and each client's; the real broker
	// BrokerPID is the process id of the broker's JVM, which the broker
	// pause stops (see testenv.BrokerPID).
	BrokerPID int
	// Transactional runs the relays in fenced mode.
	Transactional bool
	// Messages is the number of business rows written over WriteFor (zero:
	// 4000 over 45s); the writers keep that rate until the last fault is
	// over, so that every fault meets writers at work.
	Messages int
	WriteFor time.Duration
	// Rounds is how many times every fault kind is injected (zero: 1), in
	// random order, spread over WriteFor.
	Rounds int
	// Seed seeds the schedule and the writers.
	Seed int64
}

// FaultTally counts the injections of one fault kind and those of them the
// logs (or the databases) prove.
type FaultTally struct {
	Injected, Proven int
	// Evidence samples the proofs; Unproven says what was missing for each
	// injection left unproven.
	Evidence, Unproven []string
}

// EffectsCell is the effects audit of one client in one run, read from its
// consumer database against the business rows of the outbox database.
type EffectsCell struct {
	Client                string
	Committed, RolledBack int // business rows
	Effects               int // effects applied in all
	// Lost: committed rows without an effect; Duplicates: effects beyond a
	// message's first; RolledBackApplied and Unknown: effects of a
	// rolled-back row, of no committed row; Mismatched: key or sequence
	// other than the row's; OrderViolations: per-key inversions of commit
	// order; WrongCounters: keys whose counter is not their committed rows.
	Lost, Duplicates, RolledBackApplied, Unknown, Mismatched, OrderViolations, WrongCounters int
	// Faults holds every kind's tally as the client saw it (the relays' and
	// the outbox database's are the run's, shared by the cells).
	Faults map[string]*FaultTally
}

// EffectsSummary is the verdict of one effects run.
type EffectsSummary struct {
	Dialect string
	Mode    string // default or fenced
	Written int    // business rows written (committed or rolled back)
	Cells   []EffectsCell
	// Drained: the outbox table emptied and every client applied an effect
	// for each committed row within drainTimeout.
	Drained bool
	Took    time.Duration
}

// tallies returns the cell's tally of each kind in EffectsFaults' order
// (an empty one for a kind never injected).
func (s EffectsSummary) tallies(c EffectsCell) []*FaultTally {
	var out []*FaultTally
	for _, k := range EffectsFaults() {
		out = append(out, cmp.Or(c.Faults[k], &FaultTally{}))
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
		for i, f := range s.tallies(c) {
			if f.Proven == 0 {
				errs = append(errs, fmt.Errorf("chaos: effects, %s mode, %s: fault %s injected %d times, never proven", s.Mode, c.Client, EffectsFaults()[i], f.Injected))
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
	var lines []string
	for _, c := range s.Cells {
		var b strings.Builder
		fmt.Fprintf(&b, "effects: db=%s mode=%s client=%s written=%d committed=%d rolled_back=%d effects=%d lost=%d duplicates=%d rolled_back_applied=%d unknown=%d mismatched=%d order_violations=%d wrong_counters=%d drained=%t faults:",
			s.Dialect, s.Mode, c.Client, s.Written, c.Committed, c.RolledBack, c.Effects, c.Lost, c.Duplicates, c.RolledBackApplied, c.Unknown, c.Mismatched, c.OrderViolations, c.WrongCounters, s.Drained)
		for i, f := range s.tallies(c) {
			fmt.Fprintf(&b, " %s=%d/%d", EffectsFaults()[i], f.Proven, f.Injected)
		}
		fmt.Fprintf(&b, " took=%s", s.Took.Round(time.Second))
		lines = append(lines, b.String())
	}
	return strings.Join(lines, "\n")
}

// Evidence returns the proofs of every fault kind as the cell saw them,
// one line per kind.
func (s EffectsSummary) Evidence(c EffectsCell) string {
	var b strings.Builder
	for _, k := range EffectsFaults() {
		if f := c.Faults[k]; f != nil {
			fmt.Fprintf(&b, "  %s (%d injected, %d proven): %s\n", k, f.Injected, f.Proven, strings.Join(f.Evidence, "; "))
			for _, u := range f.Unproven {
				fmt.Fprintf(&b, "    unproven: %s\n", u)
			}
		}
	}
	return b.String()
}

// FormatEffects renders summaries as a Markdown table: one row per cell.
func FormatEffects(ss []EffectsSummary) string {
	var b strings.Builder
	b.WriteString("| database | relay mode | consumer | committed | rolled back | effects | lost | duplicates | order violations | wrong counters | faults proven/injected | took |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, s := range ss {
		for _, c := range s.Cells {
			var parts []string
			for i, f := range s.tallies(c) {
				parts = append(parts, fmt.Sprintf("%s %d/%d", EffectsFaults()[i], f.Proven, f.Injected))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", s.Dialect, s.Mode, c.Client, c.Committed, c.RolledBack, c.Effects,
				c.Lost, c.Duplicates, c.OrderViolations, c.WrongCounters, strings.Join(parts, ", "), s.Took.Round(time.Second))
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

// consumerGroup is one client's consumer processes, with their database.
type consumerGroup struct {
	procSet
	client string
	base   ConsumerConfig
	bin    string
	dir    string
	d      *Database // the client's consumer database
	db     *gorm.DB  // the harness's connection to it
	cell   *EffectsCell

	victims []*Proc  // killed by the inbox/after-commit failpoint (under mu)
	leavers []leaver // stopped by a rebalance fault (under mu)
	dbKills []DBKill // of the consumer database (under mu)
}

// leaver is a member a rebalance fault stopped, and when.
type leaver struct {
	p    *Proc
	left time.Time
}

// newConsumerGroup creates client's consumer database (the inbox table and
// the effect tables) and its group, without members.
func newConsumerGroup(ctx context.Context, cfg EffectsConfig, client, topic string, shared map[string]*FaultTally) (*consumerGroup, error) {
	d, err := createDatabase(ctx, cfg.Dialect, cfg.BaseDSN, "", "outbox_chaos_c_", "consumer_", consumerAppName, []string{effectCounter{}.TableName()})
	if err != nil {
		return nil, err
	}
	err = d.migrate(func(db *gorm.DB) error {
		if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
			return err
		}
		if err := db.AutoMigrate(&effect{}, &effectCounter{}); err != nil {
			return fmt.Errorf("chaos: migrate the effect tables: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	g := &consumerGroup{
		client: client, bin: cfg.Bin, dir: cfg.Dir, d: d,
		base: ConsumerConfig{Client: client, Dialect: cfg.Dialect, DSN: d.RelayDSN, Brokers: cfg.Brokers, Group: testenv.Unique("chaos-effects-" + client + "-"), Topic: topic},
		cell: &EffectsCell{Client: client, Faults: map[string]*FaultTally{FaultConsumerKill: {}, FaultRebalance: {}, FaultBrokerPause: {}, FaultConsumerDBKill: {}}},
	}
	maps.Copy(g.cell.Faults, shared)
	if g.db, err = Open(cfg.Dialect, d.DSN, harnessAppName, 2); err != nil {
		d.Drop(ctx)
		return nil, err
	}
	return g, nil
}

// start starts a member (live: one a fault may take).
func (g *consumerGroup) start(live bool, env ...string) (*Proc, error) {
	c := g.base
	c.ID = g.nextID(g.client)
	return g.procSet.start("consumer", c.ID, g.bin, g.dir, c.Args(), env, live)
}

// logs returns the group's log files but skip.
func (g *consumerGroup) logs(skip string) []string {
	var fs []string
	for _, p := range g.procs() {
		if p.Log != skip {
			fs = append(fs, p.Log)
		}
	}
	return fs
}

func (g *consumerGroup) close(ctx context.Context) {
	g.stopAll(15 * time.Second)
	closeGorm(g.db)
	g.d.Drop(ctx)
}

// RunEffects performs one effects run and returns its summary; the error
// is a setup failure (see EffectsSummary.Err for the checks).
func RunEffects(ctx context.Context, cfg EffectsConfig) (EffectsSummary, error) {
	start := time.Now()
	orDefault(&cfg.Messages, 4000)
	orDefault(&cfg.WriteFor, 45*time.Second)
	orDefault(&cfg.Rounds, 1)
	orDefault(&cfg.Logger, slog.Default())
	log := cfg.Logger
	s := EffectsSummary{Dialect: cfg.Dialect, Mode: "default"}
	if cfg.Transactional {
		s.Mode = "fenced"
	}
	// The children's logs, apart from any other run's in cfg.Dir.
	dir, err := os.MkdirTemp(cfg.Dir, "effects-"+s.Mode+"-")
	if err != nil {
		return s, fmt.Errorf("chaos: log directory: %w", err)
	}
	cfg.Dir = dir
	shared := map[string]*FaultTally{FaultRelayKill: {}, FaultRelayPause: {}, FaultZombie: {}, FaultOutboxDBKill: {}}
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
	db, err := openWriters(cfg.Dialect, d.DSN, writers+4)
	if err != nil {
		return s, err
	}
	defer closeGorm(db)
	if err := db.AutoMigrate(&order{}); err != nil {
		return s, fmt.Errorf("chaos: migrate the business table: %w", err)
	}
	topic := testenv.Unique("chaos_effects_")
	if err := CreateTopic(ctx, cfg.Brokers, topic, partitions); err != nil {
		return s, err
	}

	var groups []*consumerGroup
	defer func() {
		for _, g := range groups {
			g.close(ctx)
		}
	}()
	for _, client := range Clients() {
		g, err := newConsumerGroup(ctx, cfg, client, topic, shared)
		if err != nil {
			return s, err
		}
		groups = append(groups, g)
		for range effectsConsumers {
			if _, err := g.start(true); err != nil {
				return s, err
			}
		}
	}

	relays := cfg.relays(RelayConfig{DSN: d.RelayDSN, PublishTimeout: effectsPubTTL, TxnOutbox: txnOutbox(cfg.Transactional, topic)})
	defer relays.StopAll(10 * time.Second)
	if err := relays.add(effectsRelays); err != nil {
		return s, err
	}

	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0xeffec7))
	stopWriters := make(chan struct{})
	led := newLedger()
	writeErrs := make([]error, writers)
	var wwg sync.WaitGroup
	for w := range writers {
		wwg.Go(func() { writeErrs[w] = writeOrders(ctx, db, topic, w, cfg, stopWriters, led) })
	}
	writeUntil := time.Now().Add(cfg.WriteFor)

	// Faults: every kind once per round, shuffled within the round.
	var schedule []string
	for range cfg.Rounds {
		round := EffectsFaults()
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		schedule = append(schedule, round...)
	}
	interval := cfg.WriteFor / time.Duration(len(schedule)+1)
	h := &effectsHarness{cfg: cfg, log: log, rng: rng, d: d, db: db, relays: relays, groups: groups, faults: shared}
	next := time.Now().Add(interval)
	for _, kind := range schedule {
		sleepUntil(ctx, next)
		if ctx.Err() != nil {
			break
		}
		next = time.Now().Add(interval)
		log.Info("chaos: effects fault", "kind", kind, "mode", s.Mode)
		if err := h.inject(ctx, kind); err != nil {
			log.Warn("chaos: effects fault failed", "kind", kind, "error", err)
		}
	}
	sleepUntil(ctx, writeUntil)
	close(stopWriters)
	wwg.Wait() // they stop at once (or at ctx's end)
	if err := errors.Join(writeErrs...); err != nil {
		return s, err
	}
	s.Written = led.written
	log.Info("chaos: effects faults over; draining", "mode", s.Mode, "written", s.Written)

	// Drain: the outbox table empties, each client applies an effect for
	// every committed row, and the last message of each consumer the
	// consumer_kill fault killed is redelivered (its proof).
	var committed int64
	if err := db.Model(&order{}).Count(&committed).Error; err != nil {
		return s, fmt.Errorf("chaos: count business rows: %w", err)
	}
	for deadline := time.Now().Add(drainTimeout); ctx.Err() == nil; time.Sleep(250 * time.Millisecond) {
		var n int64
		s.Drained = db.Model(&outbox.Message{}).Count(&n).Error == nil && n == 0
		redelivered := true
		for _, g := range groups {
			var ids int64
			if err := g.db.Model(&effect{}).Distinct("message_id").Count(&ids).Error; err != nil || ids < committed {
				s.Drained = false
			}
			redelivered = redelivered && g.redelivered()
		}
		if s.Drained && redelivered || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Second) // room for a late duplicate effect
	for _, g := range groups {
		g.stopAll(15 * time.Second)
	}
	relays.StopAll(10 * time.Second)

	// The audit and the proofs that need the whole logs.
	for _, g := range groups {
		if err := auditEffects(db, g.db, led.rolledBack, g.cell); err != nil {
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

// writeOrders is writer w: transactions of 1-3 business rows with their
// messages over the keys k % writers == w (so a key's sequence numbers are
// its commit order), paced over cfg.WriteFor until stop, counted in led.
func writeOrders(ctx context.Context, db *gorm.DB, topic string, w int, cfg EffectsConfig, stop <-chan struct{}, led *ledger) error {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w)+1))
	var keys []string
	for k := w; k < effectsKeys; k += writers {
		keys = append(keys, fmt.Sprintf("k%02d", k))
	}
	if len(keys) == 0 {
		return nil
	}
	share := max(cfg.Messages/writers, 1)
	seq := map[string]int{}
	start := time.Now()
	for written := 0; ctx.Err() == nil; {
		due := time.Duration(float64(cfg.WriteFor) * float64(written) / float64(share))
		if el := time.Since(start); el < due {
			select {
			case <-stop:
				return nil
			case <-time.After(due - el):
			}
		}
		select {
		case <-stop:
			return nil
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
		if err != nil && !errors.Is(err, errRollback) {
			if ctx.Err() != nil {
				return nil
			}
			// The writers' sessions are never killed: a failed commit is
			// the harness's problem, not a fault under test.
			return fmt.Errorf("chaos: writer %d: %w", w, err)
		}
		written += n
		led.mu.Lock()
		led.written += n
		for _, m := range msgs {
			if err != nil { // errRollback
				led.rolledBack[m.MessageID.String()] = true
			}
		}
		led.mu.Unlock()
	}
	return nil
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
	relays *Relays
	groups []*consumerGroup
	faults map[string]*FaultTally // the relays' and the outbox database's

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
		return h.eachGroup(h.rebalance)
	case FaultBrokerPause:
		return h.brokerPause(ctx)
	case FaultOutboxDBKill:
		k, err := h.d.KillClientSessions(ctx)
		if err != nil {
			return err
		}
		h.faults[kind].Injected++
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
		wg.Go(func() {
			if err := f(g); err != nil {
				errs[i] = fmt.Errorf("%s: %w", g.client, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *effectsHarness) relayKill() error {
	p := h.relays.set.take(h.rng.IntN)
	if p == nil {
		return errors.New("no live relay")
	}
	f := h.faults[FaultRelayKill]
	p.Kill()
	f.Injected++
	if sig := p.ExitSignal(); sig == syscall.SIGKILL {
		f.prove("%s exited by %v", p.ID, sig)
	} else {
		f.note("%s exited with %v", p.ID, p.Err)
	}
	return h.relays.add(1)
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
	s := &h.relays.set
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.live {
		if ids[p.ID] {
			s.live = append(s.live[:i], s.live[i+1:]...)
			return p
		}
	}
	return nil
}

func (h *effectsHarness) relayPause(ctx context.Context) error {
	p := h.takeOwner()
	if p == nil {
		return errors.New("no live relay owns a bucket")
	}
	f := h.faults[FaultRelayPause]
	since := time.Now().UnixMilli()
	p.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	f.Injected++
	taken := false
	for end := stopped.Add(leaseDuration + 5*time.Second); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		// The lease audit: a bucket moved from p to another relay since.
		var n int64
		if err := h.db.Raw("SELECT COUNT(*) FROM chaos_lease_audit WHERE old_owner = ? AND new_owner IS NOT NULL AND new_owner <> ? AND at_ms >= ?", p.ID, p.ID, since).Scan(&n).Error; err == nil && n > 0 {
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
	h.relays.set.give(p)
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
	p, err := h.relays.start(h.relays.set.nextID("zombie"), false, "OUTBOX_FAILPOINTS="+fp+"=stop@2")
	if err != nil {
		return err
	}
	f := h.faults[FaultZombie]
	defer p.Stop(10 * time.Second) // an extra relay: the pool keeps its size
	if _, ok := waitForMatch(ctx, p.Log, func(l string) bool { return strings.Contains(l, "failpoint "+fp+": SIGSTOP") }, 30*time.Second); !ok {
		return fmt.Errorf("%s: the failpoint %s never fired", p.ID, fp)
	}
	stoppedAt := time.Now()
	f.Injected++
	defer p.Signal(syscall.SIGCONT)
	var buckets []int
	if err := h.db.Model(&outbox.BucketLease{}).Where("owner = ?", p.ID).Pluck("bucket", &buckets).Error; err != nil {
		return err
	}
	maxID := func() (m int64, err error) {
		err = h.db.Model(&outbox.Message{}).Select("COALESCE(MAX(id), 0)").Scan(&m).Error
		return m, err
	}
	m, err := maxID()
	if err != nil {
		return err
	}
	progressed := false
	var newer int64
	deadline := stoppedAt.Add(zombieWait)
	for ; time.Now().Before(deadline) && ctx.Err() == nil && len(buckets) > 0; time.Sleep(100 * time.Millisecond) {
		if own, err := h.owners(); err != nil || !peersOwn(own, buckets, p.ID) {
			continue
		}
		// Rows newer than the zombie's batch, committed now, in its
		// buckets: once none of them is left, a peer has published them.
		m2, err := maxID()
		if err != nil {
			return err
		}
		if err := h.db.Model(&outbox.Message{}).Where("bucket IN ? AND id > ? AND id <= ?", buckets, m, m2).Count(&newer).Error; err != nil {
			return err
		}
		if newer == 0 {
			continue
		}
		for ; time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
			var left int64
			if err := h.db.Model(&outbox.Message{}).Where("bucket IN ? AND id <= ?", buckets, m2).Count(&left).Error; err == nil && left == 0 {
				progressed = true
				break
			}
		}
		break
	}
	p.Signal(syscall.SIGCONT)
	resumed := time.Now()
	h.log.Info("chaos: zombie resumed", "relay", p.ID, "buckets", buckets, "stopped", resumed.Sub(stoppedAt).Round(time.Millisecond), "peers_published_newer_rows", progressed, "newer_rows", newer)
	stopped := resumed.Sub(stoppedAt).Seconds()
	switch {
	case !progressed:
		f.note("%s stopped %.1fs at %s (buckets %v); peers did not publish newer rows meanwhile", p.ID, stopped, fp, buckets)
	case !h.cfg.Transactional:
		f.prove("%s stopped %.1fs at %s with its records appended; peers published %d newer rows of its buckets %v meanwhile", p.ID, stopped, fp, newer, buckets)
	default: // fenced mode: its commit must be refused
		if line, ok := waitForMatch(ctx, p.Log, func(l string) bool {
			return strings.Contains(l, `msg="`+logFenced+`"`) && strings.Contains(l, "EndTxn (commit)")
		}, 15*time.Second); ok {
			f.prove("%s stopped %.1fs at %s; peers published %d newer rows of buckets %v; then its commit was refused: %s", p.ID, stopped, fp, newer, buckets, gist(line, "error="))
		} else {
			f.note("%s: no refused EndTxn (commit) in its log", p.ID)
		}
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
	p, err := g.start(false, fmt.Sprintf("OUTBOX_FAILPOINTS=inbox/after-commit=kill@%d", k))
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-time.After(60 * time.Second):
		p.Kill()
		return fmt.Errorf("%s never reached its %d-th commit", p.ID, k)
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.ExitSignal() == syscall.SIGKILL && firstInLogs([]string{p.Log}, func(l string) bool { return strings.Contains(l, "failpoint inbox/after-commit: SIGKILL") }) != "" {
		g.cell.Faults[FaultConsumerKill].Injected++
		g.mu.Lock()
		g.victims = append(g.victims, p)
		g.mu.Unlock()
	}
	return nil // the victim was an extra member: the group is back to its size
}

// rebalance stops a member gracefully (it leaves the group) and starts a
// new one (the groups' faults run at once: math/rand's goroutine-safe
// source picks the member).
func (h *effectsHarness) rebalance(g *consumerGroup) error {
	p := g.take(rand.IntN)
	if p == nil {
		return errors.New("no live consumer")
	}
	left := time.Now()
	p.Stop(15 * time.Second)
	g.cell.Faults[FaultRebalance].Injected++
	g.mu.Lock()
	g.leavers = append(g.leavers, leaver{p, left})
	g.mu.Unlock()
	_, err := g.start(true)
	return err
}

func (h *effectsHarness) brokerPause(ctx context.Context) error {
	if err := syscall.Kill(h.cfg.BrokerPID, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP the broker (%d): %w", h.cfg.BrokerPID, err)
	}
	from := time.Now()
	sleepCtx(ctx, brokerPause)
	if err := syscall.Kill(h.cfg.BrokerPID, syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT the broker (%d): %w", h.cfg.BrokerPID, err)
	}
	w := window{from, time.Now()}
	h.pauses = append(h.pauses, w)
	for _, g := range h.groups {
		g.cell.Faults[FaultBrokerPause].Injected++
	}
	return nil
}

// consumerDBKill kills the consumers' sessions of g's database until a
// kill lands mid-transaction (a consumer blocked on the lock; a group that
// is rebalancing handles nothing), at most 8 times. The proof comes at the
// end (proveConsumerFaults).
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
		if k.MidStatement > 0 || try == 8 || ctx.Err() != nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// proveConsumerFaults proves g's rebalances, consumer database kills and
// consumer kills from the whole logs.
func proveConsumerFaults(g *consumerGroup) error {
	rf := g.cell.Faults[FaultRebalance]
	for _, l := range g.leavers {
		// A member that was there before the leave logs each generation's
		// assignment (franz-go's cooperative rebalance may assign it
		// nothing new: the line still comes).
		var stayed []string
		for _, p := range g.procs() {
			if p != l.p && p.StartedAt.Before(l.left) {
				stayed = append(stayed, p.Log)
			}
		}
		if found := firstInLogs(stayed, func(s string) bool {
			at, ok := lineTime(s)
			return ok && at.After(l.left) && strings.Contains(s, `msg="`+logAssigned+`"`)
		}); found != "" {
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
		if found := firstInLogs(g.logs(""), func(l string) bool {
			at, ok := lineTime(l)
			return ok && k.echoed(at) && strings.Contains(l, `msg="`+logHandlingFailed+`"`)
		}); found != "" {
			df.prove("%d sessions killed, %d mid-transaction; %s", k.Killed, k.MidStatement, gist(found, "error="))
		} else {
			df.note("%d sessions killed, %d mid-statement; no consumer WARN within %v", k.Killed, k.MidStatement, dbKillEcho)
		}
	}
	if df.Injected > 0 && df.Proven == 0 && len(df.Unproven) == 0 {
		df.note("%d kills, none mid-transaction", len(g.dbKills))
	}
	f := g.cell.Faults[FaultConsumerKill]
	for _, v := range g.victims {
		e, found, err := g.redelivery(v)
		switch {
		case err != nil:
			return err
		case e.MessageID == "":
			f.note("%s applied no effect", v.ID)
		case found == "":
			f.note("%s killed after committing %s[%d]@%d; its redelivery never seen", v.ID, e.Key, e.Part, e.At)
		default:
			f.prove("%s killed after committing message %s (key %s, partition %d, offset %d); redelivered and skipped: %s", v.ID, e.MessageID, e.Key, e.Part, e.At, gist(found, "consumer="))
		}
	}
	return nil
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
	return e, firstInLogs(g.logs(v.Log), func(l string) bool {
		return strings.Contains(l, `msg="`+logDuplicate+`"`) && strings.Contains(l, "message_id="+e.MessageID)
	}), nil
}

// redelivered reports whether the last effect of every member the
// consumer_kill fault killed has been redelivered to another member: a
// member killed moments before the drain holds its partitions until its
// session times out.
func (g *consumerGroup) redelivered() bool {
	g.mu.Lock()
	victims := append([]*Proc(nil), g.victims...)
	g.mu.Unlock()
	for _, v := range victims {
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
	f := h.faults[FaultOutboxDBKill]
	for _, k := range h.dbKills {
		n := 0
		for _, at := range warns {
			if k.echoed(at) {
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

// effectGap returns the longest interval within w without an effect applied.
func effectGap(db *gorm.DB, w window) (time.Duration, error) {
	var ats []int64
	if err := db.Model(&effect{}).Where("applied_at_ms BETWEEN ? AND ?", w.from.UnixMilli(), w.to.UnixMilli()).Order("applied_at_ms").Pluck("applied_at_ms", &ats).Error; err != nil {
		return 0, fmt.Errorf("chaos: read effect times: %w", err)
	}
	ts := make([]time.Time, len(ats))
	for i, at := range ats {
		ts[i] = time.UnixMilli(at)
	}
	return longestGap(ts, w.from.Truncate(time.Millisecond), w.to.Truncate(time.Millisecond)), nil
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

// firstInLogs returns the first line of files, in order, that matches ("" when none does).
func firstInLogs(files []string, match func(string) bool) string {
	for _, f := range files {
		if l, ok := firstLine(f, match); ok {
			return l
		}
	}
	return ""
}

// waitForMatch waits up to timeout for a line of file that matches.
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
