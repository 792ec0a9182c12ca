package chaos

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Fault kinds of a failover run (FailoverRun): the victim is always the
// current leader of one partition of the run's topic.
const (
	FaultLeaderKill  = "leader_kill"  // SIGKILL the leader's JVM, restart the node after KillDowntime
	FaultLeaderPause = "leader_pause" // SIGSTOP the leader's JVM for PauseFor, then SIGCONT
)

// A failover run's topic (replication, min.insync.replicas), its steady
// delivery before the first fault, and its wait once every replica is back
// in sync before the next fault.
const (
	failoverReplication = 3
	failoverMinISR      = 2
	failoverWarmup      = 8 * time.Second
	failoverSettle      = 3 * time.Second
)

// ClusterNodes controls the nodes of a Kafka cluster by node id (the
// broker id in the metadata); testenv.KafkaCluster implements it.
type ClusterNodes interface {
	// Signal sends sig to the node's process.
	Signal(node int, sig syscall.Signal) error
	// Start starts a stopped node and returns once it has started.
	Start(ctx context.Context, node int) error
}

// FailoverConfig configures FailoverRun. Zero sizes take the defaults
// named.
type FailoverConfig struct {
	Env // Dialect postgres (the acknowledgement audit); Brokers the cluster's, one per node
	// Nodes kills, pauses and restarts the cluster's nodes.
	Nodes ClusterNodes
	// Relays (zero: 3); Faults (zero: 4), leader kills and pauses in turn
	// while the writers spread Messages over WriteFor (zero: 15000, 120s).
	Relays, Faults, Messages int
	WriteFor                 time.Duration
	// KillDowntime and PauseFor: how long a killed node stays down and a
	// paused one frozen (zero: 12s each, longer than Kafka's 9s
	// broker.session.timeout.ms, so that leadership moves).
	KillDowntime, PauseFor time.Duration
	// PublishTimeout is the relays' (zero: 5s).
	PublishTimeout time.Duration
	// Seed seeds the writers.
	Seed int64
}

// FailoverFault is one injected fault and what followed it.
type FailoverFault struct {
	Kind      string
	Node      int // the victim: the partition's leader when the fault began
	Partition int
	At        time.Time
	// Held: how long the node was down or frozen; LeaderMoved: from the
	// fault until the metadata named another leader (negative: never);
	// Restart: how long the killed node took to start; InSync: from its
	// restart or resume until every replica was in sync again.
	Held, LeaderMoved, Restart, InSync time.Duration
	// Stall is the longest time in the fault's window (until the next
	// fault or the end of the writes) without an acknowledgement (a row
	// deleted: the relays delete a row once acks=all acknowledged it);
	// PartitionStall the same for the rows of the victim's partition.
	Stall, PartitionStall time.Duration
}

// FailoverSummary is the verdict of a failover run.
type FailoverSummary struct {
	Dialect                string
	Brokers, Relays        int
	Replication, MinISR    int
	Written, Committed     int
	RolledBack, InDoubt    int
	Check                  Check
	DualOwners             int64
	Drained                bool
	Faults                 []FailoverFault
	BaselineStall          time.Duration // longest time without an acknowledgement before the first fault
	BaselinePartitionStall time.Duration // the same, on the partition where it was longest
	PublishTimeout         time.Duration
	KillDowntime, PauseFor time.Duration
	Took                   time.Duration
	lastWrite              time.Time
}

// Count returns the number of faults of kind.
func (s FailoverSummary) Count(kind string) int {
	n, _, _ := s.stats(kind)
	return n
}

// stats returns the number of faults of kind and their longest topic-wide
// and partition stall.
func (s FailoverSummary) stats(kind string) (n int, topic, partition time.Duration) {
	for _, f := range s.Faults {
		if f.Kind == kind {
			n, topic, partition = n+1, max(topic, f.Stall), max(partition, f.PartitionStall)
		}
	}
	return n, topic, partition
}

// Err reports the first failed check, or nil.
func (s FailoverSummary) Err() error { return s.Check.err("failover", s.DualOwners, s.Drained) }

// String is the one-line summary.
func (s FailoverSummary) String() string {
	kn, ks, ps := s.stats(FaultLeaderKill)
	pn, kp, pp := s.stats(FaultLeaderPause)
	return fmt.Sprintf("failover: db=%s brokers=%d rf=%d min_isr=%d relays=%d publish_timeout=%s messages=%d committed=%d rolled_back=%d in_doubt=%d records=%d lost=%d rolled_back_arrived=%d order_violations=%d duplicates=%d dual_owners=%d drained=%t faults=%d (%s=%d %s=%d) longest_stall kill=%s (partition %s) pause=%s (partition %s) baseline=%s (partition %s) took=%s",
		s.Dialect, s.Brokers, s.Replication, s.MinISR, s.Relays, s.PublishTimeout, s.Written, s.Committed, s.RolledBack, s.InDoubt, s.Check.Records,
		s.Check.Lost, s.Check.RolledBackArrived, s.Check.OrderViolations, s.Check.Duplicates, s.DualOwners, s.Drained,
		len(s.Faults), FaultLeaderKill, kn, FaultLeaderPause, pn,
		ms(ks), ms(ps), ms(kp), ms(pp), ms(s.BaselineStall), ms(s.BaselinePartitionStall), s.Took.Round(time.Second))
}

func ms(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

// FormatFailover renders the faults of s as a Markdown table.
func FormatFailover(s FailoverSummary) string {
	var b strings.Builder
	b.WriteString("| # | fault | node | partition | held | leader moved after | restart took | all in sync after | longest stall, topic | longest stall, partition |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, f := range s.Faults {
		restart := "—"
		if f.Kind == FaultLeaderKill {
			restart = ms(f.Restart)
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", i+1, f.Kind, f.Node, f.Partition,
			ms(f.Held), ms(f.LeaderMoved), restart, ms(f.InSync), ms(f.Stall), ms(f.PartitionStall))
	}
	return b.String()
}

// FailoverRun kills and pauses partition leaders of a Kafka cluster, one at
// a time, under writers and relay processes, checks the delivery and
// measures each fault's stall. The error is a setup failure or a cluster
// that did not heal (see FailoverSummary.Err for the checks).
func FailoverRun(ctx context.Context, cfg FailoverConfig) (FailoverSummary, error) {
	start := time.Now()
	orDefault(&cfg.Relays, 3)
	orDefault(&cfg.Faults, 4)
	orDefault(&cfg.Messages, 15000)
	orDefault(&cfg.WriteFor, 120*time.Second)
	orDefault(&cfg.KillDowntime, 12*time.Second)
	orDefault(&cfg.PauseFor, 12*time.Second)
	orDefault(&cfg.PublishTimeout, 5*time.Second)
	orDefault(&cfg.Logger, slog.Default())
	log := cfg.Logger
	s := FailoverSummary{Dialect: cfg.Dialect, Brokers: len(cfg.Brokers), Relays: cfg.Relays, Replication: failoverReplication, MinISR: failoverMinISR,
		PublishTimeout: cfg.PublishTimeout, KillDowntime: cfg.KillDowntime, PauseFor: cfg.PauseFor}
	if len(cfg.Brokers) < failoverReplication || cfg.Nodes == nil {
		return s, fmt.Errorf("failover: need %d brokers and their nodes (have %d)", failoverReplication, len(cfg.Brokers))
	}
	if cfg.Dialect != Postgres {
		return s, fmt.Errorf("failover: needs PostgreSQL (the acknowledgement audit), not %s", cfg.Dialect)
	}
	// Every node runs: a leftover paused or killed node from an aborted
	// run would make the first fault a double one.
	if err := waitInSync(ctx, cfg.Brokers, "", 60*time.Second); err != nil {
		return s, err
	}
	d, err := CreateDatabase(ctx, cfg.Dialect, cfg.BaseDSN, cfg.Dir)
	if err != nil {
		return s, err
	}
	defer d.Drop(ctx)
	if err := d.migrate(createAckAudit); err != nil {
		return s, err
	}
	topic := testenv.Unique("chaos_failover_")
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: failoverReplication,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(failoverMinISR)}}}
	if err := testenv.CreateTopic(ctx, clusterDialer, cfg.Brokers, tc); err != nil {
		return s, err
	}
	cctx, cancelConsumer := context.WithCancel(ctx)
	consumer := StartConsumer(cctx, cfg.Brokers, topic, partitions)
	defer consumer.Wait()
	defer cancelConsumer()
	db, err := openWriters(cfg.Dialect, d.DSN, writers+2)
	if err != nil {
		return s, err
	}
	defer closeGorm(db)
	// No relay faults here: a long lease keeps the buckets with their
	// owners while the brokers fail.
	relays := cfg.relays(RelayConfig{DSN: d.DSN, LeaseDuration: 15 * time.Second, RenewInterval: 3 * time.Second, PublishTimeout: cfg.PublishTimeout})
	defer relays.StopAll(10 * time.Second)
	if err := relays.add(cfg.Relays); err != nil {
		return s, err
	}

	// The chaos run's writers (rollbacks, in-doubt commits, a pinned
	// partition per writer, a few keyless messages).
	led := newLedger()
	writeStart := time.Now()
	writersDone := startWriters(ctx, db, topic, RunConfig{Messages: cfg.Messages, WriteFor: cfg.WriteFor, Seed: cfg.Seed}, led, nil)
	sleepCtx(ctx, failoverWarmup)
	var faultErr error
	for i := 0; i < cfg.Faults && ctx.Err() == nil; i++ {
		kind, held := FaultLeaderKill, cfg.KillDowntime
		if i%2 == 1 {
			kind, held = FaultLeaderPause, cfg.PauseFor
		}
		// a fault ends with the node back in sync (a restart takes ~10 s)
		if time.Until(writeStart.Add(cfg.WriteFor)) < held+15*time.Second {
			log.Warn("failover: no time left for the remaining faults before the writers end", "injected", i, "wanted", cfg.Faults)
			break
		}
		var f FailoverFault
		if f, faultErr = leaderFault(ctx, cfg, topic, kind, held, i%partitions, log); f.Kind != "" {
			s.Faults = append(s.Faults, f)
		}
		if faultErr != nil {
			break
		}
		sleepCtx(ctx, failoverSettle)
	}
	select {
	case <-writersDone:
	case <-ctx.Done():
	}
	s.lastWrite = time.Now()
	log.Info("failover: writers done; draining", "faults", len(s.Faults))

	s.Drained = drain(ctx, db, led, consumer, drainTimeout)
	if s.DualOwners, _, err = DualOwners(db); err != nil {
		return s, fmt.Errorf("failover: read lease audit: %w", err)
	}
	led.mu.Lock()
	s.Check = consumer.Verify(led.perKey, led.keyless, led.doubt, led.rolledBack)
	s.Written, s.Committed, s.RolledBack, s.InDoubt = led.written, led.committed, len(led.rolledBack), len(led.doubt)
	led.mu.Unlock()
	if err := measureStalls(db, &s, consumer, writeStart); err != nil {
		return s, err
	}
	s.Took = time.Since(start)
	return s, cmp.Or(faultErr, ctx.Err())
}

// leaderFault injects one fault on the leader of partition, for held, and
// waits until every partition has all its replicas in sync again.
func leaderFault(ctx context.Context, cfg FailoverConfig, topic, kind string, held time.Duration, partition int, log *slog.Logger) (FailoverFault, error) {
	f := FailoverFault{Kind: kind, Partition: partition, LeaderMoved: -1, InSync: -1}
	lb, err := partitionLeader(ctx, cfg.Brokers, topic, partition, "")
	if err != nil {
		return FailoverFault{}, err
	}
	if lb.ID < 0 {
		return FailoverFault{}, fmt.Errorf("failover: partition %d has no leader", partition)
	}
	leader, leaderAddr := lb.ID, net.JoinHostPort(lb.Host, strconv.Itoa(lb.Port))
	f.Node = leader
	sig := syscall.SIGKILL
	if kind == FaultLeaderPause {
		sig = syscall.SIGSTOP
	}
	log.Info("failover: fault", "kind", kind, "node", leader, "partition", partition)
	f.At = time.Now()
	if err := cfg.Nodes.Signal(leader, sig); err != nil {
		return FailoverFault{}, err
	}
	// Watch the partition's leadership (asking the other nodes) while the
	// victim is down.
	wctx, stopWatch := context.WithCancel(ctx)
	moved := make(chan time.Duration, 1)
	go func() {
		for wctx.Err() == nil {
			if l, err := partitionLeader(wctx, cfg.Brokers, topic, partition, leaderAddr); err == nil && l.ID >= 0 && l.ID != leader {
				moved <- time.Since(f.At)
				return
			}
			sleepCtx(wctx, 200*time.Millisecond)
		}
		moved <- -1
	}()
	sleepCtx(ctx, held)
	f.Held = time.Since(f.At)
	stopWatch()
	f.LeaderMoved = <-moved
	t0 := time.Now()
	if kind == FaultLeaderKill {
		if err := cfg.Nodes.Start(context.WithoutCancel(ctx), leader); err != nil {
			return f, fmt.Errorf("failover: restart node %d: %w", leader, err)
		}
		f.Restart = time.Since(t0)
	} else if err := cfg.Nodes.Signal(leader, syscall.SIGCONT); err != nil {
		return f, err
	}
	backAt := time.Now()
	if err := waitInSync(ctx, cfg.Brokers, topic, 90*time.Second); err != nil {
		return f, fmt.Errorf("failover: after %s of node %d: %w", kind, leader, err)
	}
	f.InSync = time.Since(backAt)
	log.Info("failover: recovered", "kind", kind, "node", leader, "leader_moved", f.LeaderMoved, "restart", f.Restart, "in_sync", f.InSync)
	return f, nil
}

// createAckAudit records when each outbox row is deleted, that is
// acknowledged (PostgreSQL statement trigger, the database's clock).
func createAckAudit(db *gorm.DB) error {
	for _, q := range []string{
		"CREATE TABLE chaos_ack_audit (message_id TEXT, at_us BIGINT)",
		`CREATE FUNCTION chaos_ack_audit() RETURNS trigger AS $$ BEGIN
  INSERT INTO chaos_ack_audit SELECT message_id::text, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM gone;
  RETURN NULL;
END $$ LANGUAGE plpgsql`,
		"CREATE TRIGGER chaos_ack_audit AFTER DELETE ON " + outbox.DefaultMessagesTable + " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION chaos_ack_audit()",
	} {
		if err := db.Exec(q).Error; err != nil {
			return fmt.Errorf("failover: acknowledgement audit: %w", err)
		}
	}
	return nil
}

// measureStalls reads the acknowledgements and computes the longest times
// without one, on the topic and per partition (a row's partition is the
// one the consumer read it from).
func measureStalls(db *gorm.DB, s *FailoverSummary, c *Consumer, writeStart time.Time) error {
	var acks []struct {
		MessageID string
		AtUs      int64
	}
	if err := db.Raw("SELECT message_id, at_us FROM chaos_ack_audit ORDER BY at_us").Scan(&acks).Error; err != nil {
		return fmt.Errorf("failover: read acknowledgement audit: %w", err)
	}
	parts, _, _ := c.Snapshot()
	partOf := map[string]int{}
	for p, recs := range parts {
		for _, r := range recs {
			partOf[r.ID] = p
		}
	}
	all := make([]time.Time, 0, len(acks))
	byPart := make([][]time.Time, len(parts))
	for _, a := range acks {
		at := time.UnixMicro(a.AtUs)
		all = append(all, at)
		if p, ok := partOf[a.MessageID]; ok {
			byPart[p] = append(byPart[p], at)
		}
	}
	for _, ts := range append(byPart, all) {
		slices.SortFunc(ts, time.Time.Compare)
	}
	if len(s.Faults) > 0 {
		// baseline: from 2 s into the writes to the first fault
		from, to := writeStart.Add(2*time.Second), s.Faults[0].At
		s.BaselineStall = longestGap(all, from, to)
		for _, ts := range byPart {
			s.BaselinePartitionStall = max(s.BaselinePartitionStall, longestGap(ts, from, to))
		}
	}
	for i := range s.Faults {
		f := &s.Faults[i]
		to := s.lastWrite
		if i+1 < len(s.Faults) {
			to = s.Faults[i+1].At
		}
		f.Stall = longestGap(all, f.At, to)
		f.PartitionStall = longestGap(byPart[f.Partition], f.At, to)
	}
	return nil
}

// longestGap is the longest interval inside [from, to] with no time of ts
// (sorted) in it.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	var longest time.Duration
	prev := from
	for _, t := range ts {
		if !t.After(from) {
			continue
		}
		if t.After(to) {
			break
		}
		longest = max(longest, t.Sub(prev))
		prev = t
	}
	// nothing until the window's end: the gap runs to it
	return max(longest, to.Sub(prev))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// clusterDialer bounds every metadata request: a paused broker accepts a
// connection and never answers.
var clusterDialer = &kafka.Dialer{Timeout: 2 * time.Second}

// readPartitions asks the first broker that answers, skipping avoid (an
// address: a paused broker would hold the request until the deadline).
func readPartitions(ctx context.Context, brokers []string, topic, avoid string) ([]kafka.Partition, error) {
	var lastErr error
	for _, addr := range brokers {
		if addr == avoid {
			continue
		}
		ps, err := func() ([]kafka.Partition, error) {
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			conn, err := clusterDialer.DialContext(dctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			if topic == "" {
				return conn.ReadPartitions()
			}
			return conn.ReadPartitions(topic)
		}()
		if err == nil {
			return ps, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("failover: no broker answered a metadata request: %w", lastErr)
}

// partitionLeader returns partition's leader (ID -1 when it has none),
// asking the brokers other than avoid (an address; empty: any).
func partitionLeader(ctx context.Context, brokers []string, topic string, partition int, avoid string) (kafka.Broker, error) {
	ps, err := readPartitions(ctx, brokers, topic, avoid)
	if err != nil {
		return kafka.Broker{ID: -1}, err
	}
	for _, p := range ps {
		if p.Topic == topic && p.ID == partition {
			if p.Leader.Host == "" {
				return kafka.Broker{ID: -1}, nil
			}
			return p.Leader, nil
		}
	}
	return kafka.Broker{ID: -1}, fmt.Errorf("failover: no partition %d of %s in the metadata", partition, topic)
}

// waitInSync waits until every partition of topic (every topic when empty)
// has a leader and all its replicas in sync.
func waitInSync(ctx context.Context, brokers []string, topic string, timeout time.Duration) error {
	const replication = failoverReplication
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		ps, err := readPartitions(ctx, brokers, topic, "")
		if err == nil {
			last = ""
			for _, p := range ps {
				if p.Leader.Host == "" || len(p.Isr) < replication {
					last = fmt.Sprintf("%s/%d: leader %d, %d of %d replicas in sync", p.Topic, p.ID, p.Leader.ID, len(p.Isr), replication)
					break
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("failover: replicas not in sync after %s (%s)", timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
