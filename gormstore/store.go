// Package gormstore is the GORM-backed relay.Store: bucket leases, relay
// heartbeats and pending outbox rows kept in the three outbox tables on
// PostgreSQL, MySQL/MariaDB or SQLite. On SQLite, whose single writer
// serialises the relay's statements, set relay.Options.SingleWriter.
//
// Every lease step is a single guarded statement in autocommit: no lock is
// held across steps, so a slow relay never blocks its peers. Times are Unix
// milliseconds compared as integers. Table names come from the
// outbox.Config shared with outbox.Plugin and are quoted by GORM.
//
// # One clock: the database's
//
// The lease, relay and park columns are written and compared on the
// database server's clock (clock.go), so relays whose host clocks disagree
// still agree on when a lease expires; Options.Clock replaces it.
// created_at is the writers' hosts'; ClockOffset reports the relay host's
// offset to the store's clock.
//
// # Isolation
//
// Every read that decides what is published, deleted, owned or parked sees
// only committed rows whatever the pool's default isolation: PostgreSQL's
// and SQLite's autocommit reads do (SQLite's shared-cache mode is not
// supported); on MySQL and MariaDB each read is a READ ONLY transaction at
// READ COMMITTED. Writes are single autocommit statements, except
// RequeueParked and DeleteParked, which lock their rows in one READ
// COMMITTED transaction.
//
// # The primary
//
// Every statement, reads included, runs on the primary: each carries the
// setting "gorm:db_resolver:write" (dbresolver's Write clause), and the
// store asks a callback named "gorm:db_resolver" for the source pool
// first, so that its transactions and raw statements start there too. A
// lagging replica would flap ownership and republish deleted rows.
//
// # Parking
//
// A parked row stays in the messages table with parked_at_ms and
// parked_reason set, which only the store writes. Every heartbeat carries
// Features; Fleet reports CanPark false while a live relay lacks parking.
// Upgrade: apply the schema change first (outbox.AutoMigrate, or
// migrations/<dialect>/000002_parking.up.sql), then deploy the new relays.
// Downgrade only after requeueing or deleting every parked row, with the
// new relays stopped: an old relay would publish parked rows out of order.
//
// # Session state
//
// No statement depends on or leaves session state (no SET SESSION, no
// temporary table, no prepared statement of the store's own): the store
// works behind PgBouncer in transaction pooling mode.
package gormstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// DefaultPruneInterval is how often, at most, an acquisition round deletes
// the heartbeat rows of long-gone relays when Options.PruneInterval is zero.
const DefaultPruneInterval = time.Minute

// Clock is the time source the store reads: relay.Clock and
// relaytest.ManualClock satisfy it.
type Clock interface {
	Now() time.Time
}

// Options configures a Store. The zero Options means outbox's default
// Config, the database's clock and the default intervals.
type Options struct {
	// Config names the outbox tables and the bucket count; share the value
	// given to outbox.Plugin. The zero Config means outbox's defaults; an
	// invalid Config fails New.
	Config outbox.Config
	// Clock, when set, replaces the database's clock for every lease, relay
	// and park time. A dialect other than PostgreSQL, MySQL/MariaDB and SQLite
	// has no known clock expression: New fails unless Clock is set.
	Clock Clock
	// HostClock is the relay host's clock, against which ClockOffset measures
	// the store's. Nil means the system clock.
	HostClock Clock
	// PruneInterval is the least time between two deletions of stale heartbeat
	// rows (relays unseen for 10 × the lease duration, stopped ones after 1 ×)
	// within an acquisition round. Zero means DefaultPruneInterval; a negative
	// value fails New.
	PruneInterval time.Duration
	// StatementTimeout bounds every statement of the store (and each read
	// transaction on MySQL/MariaDB): a context deadline per statement that
	// ends it on the server too (pgx's cancel request; MariaDB's SET
	// STATEMENT max_statement_time). On SQLite keep the DSN's
	// _busy_timeout at most StatementTimeout. Zero means
	// DefaultStatementTimeout; a negative value fails New.
	StatementTimeout time.Duration
	// Logger receives the store's warnings. Nil means slog.Default().
	Logger *slog.Logger
}

// Store is a relay.Store and a relay.ParkAdmin on a *gorm.DB, with an
// inspection API for operators and the bucket-count change (Rebucket). Any
// bucket count up to outbox.MaxBucketCount works on every dialect. It is
// safe for concurrent use; each relay should have its own Store.
type Store struct {
	db      *gorm.DB
	cfg     outbox.Config
	now     func() time.Time // nil: the database's clock
	hostNow func() time.Time
	prune   time.Duration
	msgs    string
	leases  string
	relays  string
	timeout time.Duration
	hot     hotSQL
	locs    rowLocations // where the rows read lie (PostgreSQL): see locations.go
	log     *slog.Logger

	mu        sync.Mutex
	dialect   int // a kind*; kindUnknownMySQL until asked
	seeded    bool
	pool      poolWatch     // the pool's closes for want of idle room (poolwatch.go)
	acquired  bool          // an acquisition round succeeded
	nextPrune int64         // Unix ms
	lease     time.Duration // of the latest acquisition round; 0 before the first
	offset    clockSample   // of the latest clock read (see nowMs)
}

var (
	_ relay.Store     = (*Store)(nil)
	_ relay.ParkAdmin = (*Store)(nil)
)

// New returns a Store on db. The tables must exist (outbox.AutoMigrate or
// the migrations). It fails when db is nil or an option is invalid, naming
// the option.
func New(db *gorm.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("gormstore: New: nil *gorm.DB")
	}
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("gormstore: Options.Config: %w", err)
	}
	if opts.PruneInterval < 0 {
		return nil, fmt.Errorf("gormstore: Options.PruneInterval %v: must not be negative", opts.PruneInterval)
	}
	if opts.StatementTimeout < 0 {
		return nil, fmt.Errorf("gormstore: Options.StatementTimeout %v: must not be negative", opts.StatementTimeout)
	}
	if opts.StatementTimeout == 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.PruneInterval == 0 {
		opts.PruneInterval = DefaultPruneInterval
	}
	if opts.HostClock == nil {
		opts.HostClock = relay.SystemClock{}
	}
	kind := kindOf(db.Dialector.Name())
	if opts.Clock == nil && kind == kindOther {
		return nil, fmt.Errorf("gormstore: Options.Clock: nil, and dialect %q has no known clock expression: set Clock", db.Dialector.Name())
	}
	var now func() time.Time
	if opts.Clock != nil {
		now = opts.Clock.Now
	}
	cfg := opts.Config.WithDefaults()
	if db.Logger != nil {
		db = db.Session(&gorm.Session{Logger: quietErrors{db.Logger}})
	}
	return &Store{
		db:      db,
		cfg:     cfg,
		now:     now,
		hostNow: opts.HostClock.Now,
		prune:   opts.PruneInterval,
		msgs:    cfg.MessagesTableName(),
		leases:  cfg.LeasesTableName(),
		relays:  cfg.RelaysTableName(),
		timeout: opts.StatementTimeout,
		dialect: kind,
		hot:     buildHotSQL(db, cfg.MessagesTableName()),
		log:     cmp.Or(opts.Logger, slog.Default()),
	}, nil
}

// BucketCount implements relay.Store: the Config's bucket count.
func (s *Store) BucketCount() int { return s.cfg.BucketCount }

// liveRelay is the guard every lease write of relayID carries: its heartbeat
// row is live at now and not stopped. A statement of a relay that already
// stopped (released) therefore changes nothing.
func (s *Store) liveRelay(relayID string, nowMs int64, lease time.Duration) (string, []any) {
	return "EXISTS (SELECT 1 FROM ? WHERE relay_id = ? AND stopped_at_ms IS NULL AND last_seen_ms > ?)",
		[]any{clause.Table{Name: s.relays}, relayID, nowMs - lease.Milliseconds()}
}

// notBackwards is an expiry never moved backwards: max(expires_at_ms, exp).
func notBackwards(exp int64) clause.Expr {
	return gorm.Expr("CASE WHEN expires_at_ms < ? THEN ? ELSE expires_at_ms END", exp, exp)
}

// AcquireBucketLeases implements relay.Store: one round of single
// statements (clock, seed, heartbeat, prune, probe, reads, extend, release,
// claim, read back). A store table missing before the first successful
// round fails it with relay.ErrMisconfigured, which stops the relay.
func (s *Store) AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) (relay.Leases, error) {
	s.watchPool(ctx, s.hostNow())
	l, err := s.acquireBucketLeases(ctx, relayID, bucketCount, leaseDuration)
	s.mu.Lock()
	first := !s.acquired
	s.acquired = s.acquired || err == nil
	s.mu.Unlock()
	if err != nil && first && !errors.Is(err, relay.ErrMisconfigured) && ctx.Err() == nil {
		err = s.explainMissingTables(ctx, err)
	}
	return l, err
}

func (s *Store) acquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) (relay.Leases, error) {
	if err := checkArgs(relayID, leaseDuration); err != nil {
		return relay.Leases{}, err
	}
	n := s.cfg.BucketCount
	if bucketCount != n {
		return relay.Leases{}, fmt.Errorf("gormstore: bucket count %d: the store's Config.BucketCount is %d: %w", bucketCount, n, relay.ErrMisconfigured)
	}
	// 0. The round's "now": the database's clock (or Options.Clock).
	now, err := s.nowMs(ctx)
	if err != nil {
		return relay.Leases{}, err
	}
	ld := leaseDuration.Milliseconds()
	exp := now + ld
	s.mu.Lock()
	s.lease = leaseDuration
	s.mu.Unlock()

	// 1. The fleet's bucket count, before the first heartbeat: a relay with
	// another count is never counted as a peer.
	if err := s.seed(ctx, relayID, now, ld); err != nil {
		return relay.Leases{}, err
	}
	// 2. Heartbeat, then maybe prune.
	if err := s.heartbeat(ctx, relayID, now); err != nil {
		return relay.Leases{}, err
	}
	if err := s.maybePrune(ctx, now, ld); err != nil {
		return relay.Leases{}, err
	}
	// 3-5. Misconfiguration probe, active relays (the caller always
	// counts), lease snapshot.
	var active []string
	var snap []outbox.BucketLease
	err = s.read(ctx, s.leases, func(q *gorm.DB) error {
		var ends struct{ Lo, Hi sql.NullInt64 }
		if err := s.bucketsOutside(q).Scan(&ends).Error; err != nil {
			return fmt.Errorf("gormstore: probe for out-of-range buckets: %w", err)
		}
		if bad := cmp.Or(ends.Lo, ends.Hi); bad.Valid {
			return fmt.Errorf("gormstore: %s holds a row in bucket %d, outside [0, %d): writers and relays disagree on BucketCount %d: %w",
				s.msgs, bad.Int64, n, n, relay.ErrMisconfigured)
		}
		if err := q.Table(s.relays).Where("last_seen_ms > ? AND stopped_at_ms IS NULL", now-ld).Pluck("relay_id", &active).Error; err != nil {
			return fmt.Errorf("gormstore: read active relays: %w", err)
		}
		snap = snap[:0]
		if err := s.scanLeases(q, n, &snap); err != nil {
			return fmt.Errorf("gormstore: read leases: %w", err)
		}
		return nil
	})
	if err != nil {
		return relay.Leases{}, err
	}
	if len(snap) < n {
		// Lease rows went missing after the seed (a restore, a mistaken
		// cleanup): without them no relay could ever own those buckets.
		if snap, err = s.reseed(ctx, snap, now, ld); err != nil {
			return relay.Leases{}, err
		}
	}
	// Share, keep / release / claim.
	held := make(map[string]int, len(active)+1)
	for _, id := range active {
		held[id] = 0
	}
	held[relayID] = 0
	var owned, free []int
	others := 0 // buckets live peers hold
	for _, l := range snap {
		switch {
		case l.ExpiresAtMs <= now: // a recreated row is free only once its expiry passed
			free = append(free, int(l.Bucket))
		case l.Owner == nil:
		case *l.Owner == relayID:
			owned = append(owned, int(l.Bucket))
			held[relayID]++
		default:
			if _, ok := held[*l.Owner]; ok {
				held[*l.Owner]++
				others++
			}
		}
	}
	share := relay.Shares(n, held)[relayID]
	keep, excess := owned, []int(nil)
	if len(owned) > share {
		keep, excess = owned[:share], owned[share:]
	}
	guard, guardArgs := s.liveRelay(relayID, now, leaseDuration)
	for _, set := range bucketSets(keep) {
		err := s.write(ctx, s.leases, func(q *gorm.DB) error {
			return q.Table(s.leases).
				Where("owner = ? AND expires_at_ms > ?", relayID, now).
				Where(set.cond, set.args...).
				Where(guard, guardArgs...).
				Update("expires_at_ms", notBackwards(exp)).Error
		})
		if err != nil {
			return relay.Leases{}, fmt.Errorf("gormstore: extend %d leases: %w", set.n, err)
		}
	}
	if len(excess) > 0 {
		if err := s.free(ctx, relayID, excess); err != nil {
			return relay.Leases{}, err
		}
	}
	if need := share - len(keep); need > 0 && len(free) > 0 {
		// From this relay's own starting point: relays starting together
		// claim different buckets.
		at, _ := slices.BinarySearch(free, relay.ClaimStart(n, relayID, held))
		free = append(free[at:], free[:at]...)
		for _, set := range bucketSets(free[:min(need, len(free))]) {
			err := s.write(ctx, s.leases, func(q *gorm.DB) error {
				return q.Table(s.leases).
					Where("expires_at_ms <= ?", now).
					Where(set.cond, set.args...).
					Where(guard, guardArgs...).
					Updates(map[string]any{"owner": relayID, "expires_at_ms": exp}).Error
			})
			if err != nil {
				return relay.Leases{}, fmt.Errorf("gormstore: claim %d leases: %w", set.n, err)
			}
		}
	}
	// 6. Read back.
	var mine []int
	if err := s.read(ctx, s.leases, func(q *gorm.DB) error {
		return q.Table(s.leases).
			Where("owner = ? AND expires_at_ms >= ? AND bucket >= ? AND bucket < ?", relayID, exp, 0, n).
			Order("bucket").Pluck("bucket", &mine).Error
	}); err != nil {
		return relay.Leases{}, fmt.Errorf("gormstore: read owned leases: %w", err)
	}
	if mine == nil {
		mine = []int{}
	}
	return relay.Leases{Owned: mine, Share: share, Relays: len(held), Unowned: max(0, n-others-len(mine))}, nil
}

func checkArgs(relayID string, leaseDuration time.Duration) error {
	if relayID == "" || len(relayID) > 128 {
		return fmt.Errorf("gormstore: relay id %q: must be 1 to 128 bytes", relayID)
	}
	if leaseDuration < time.Millisecond {
		return fmt.Errorf("gormstore: lease duration %v: must be at least 1ms", leaseDuration)
	}
	return nil
}

// Features is the capability bit set every heartbeat writes (parking): a
// relay whose row lacks it makes Fleet report CanPark false.
const Features = outbox.RelayFeatureParking

// heartbeat upserts relayID's last-seen, never backwards, and clears its
// stopped stamp unless that is not older than now: a late heartbeat from
// before a release does not revive the relay.
func (s *Store) heartbeat(ctx context.Context, relayID string, now int64) error {
	last := clause.Column{Table: s.relays, Name: "last_seen_ms"}
	stopped := clause.Column{Table: s.relays, Name: "stopped_at_ms"}
	err := s.write(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).Clauses(clause.OnConflict{
			Columns: []clause.Column{{Name: "relay_id"}},
			DoUpdates: clause.Set{
				// stopped_at_ms first: MySQL evaluates assignments left to right.
				{Column: clause.Column{Name: "stopped_at_ms"}, Value: gorm.Expr("CASE WHEN ? >= ? THEN ? ELSE NULL END", stopped, now, stopped)},
				{Column: clause.Column{Name: "last_seen_ms"}, Value: gorm.Expr("CASE WHEN ? < ? THEN ? ELSE ? END", last, now, now, last)},
				{Column: clause.Column{Name: "features"}, Value: Features},
			},
		}).Create(&outbox.RelayHeartbeat{RelayID: relayID, LastSeenMs: now, Features: Features}).Error
	})
	if err != nil {
		return fmt.Errorf("gormstore: heartbeat of %s: %w", relayID, err)
	}
	return nil
}

func (s *Store) maybePrune(ctx context.Context, now, ld int64) error {
	s.mu.Lock()
	due := now >= s.nextPrune
	s.mu.Unlock()
	if !due {
		return nil
	}
	err := s.write(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).
			Where("(stopped_at_ms IS NULL AND last_seen_ms < ?) OR (stopped_at_ms IS NOT NULL AND stopped_at_ms < ?)", now-10*ld, now-ld).
			Delete(&outbox.RelayHeartbeat{}).Error
	})
	if err != nil {
		return fmt.Errorf("gormstore: prune heartbeats: %w", err)
	}
	s.mu.Lock()
	s.nextPrune = now + s.prune.Milliseconds()
	s.mu.Unlock()
	return nil
}

// seed checks, in the store's first round, that the lease table holds this
// store's bucket count, and seeds an empty one: free rows, or, when another
// relay is live, rows no relay claims before an earlier lease has run out.
func (s *Store) seed(ctx context.Context, relayID string, now, ld int64) error {
	s.mu.Lock()
	done := s.seeded
	s.mu.Unlock()
	if done {
		return nil
	}
	n := s.cfg.BucketCount
	var top sql.NullInt64
	var peers int64
	if err := s.read(ctx, s.leases, func(q *gorm.DB) error {
		if err := q.Table(s.leases).Select("MAX(bucket)").Scan(&top).Error; err != nil || top.Valid {
			return err
		}
		return q.Table(s.relays).Where("relay_id <> ? AND last_seen_ms > ? AND stopped_at_ms IS NULL", relayID, now-ld).Count(&peers).Error
	}); err != nil {
		return fmt.Errorf("gormstore: read the bucket count of %s: %w", s.leases, err)
	}
	if top.Valid && int(top.Int64)+1 != n {
		return fmt.Errorf("gormstore: the lease table %s holds %d buckets and this relay's bucket count is %d: every relay and writer must use the table's count (change it with outbox-relay rebucket): %w",
			s.leases, top.Int64+1, n, relay.ErrMisconfigured)
	}
	if !top.Valid {
		var exp int64
		if peers > 0 {
			exp = now + ld
		}
		if err := s.insertLeases(ctx, 0, n, exp); err != nil {
			return err
		}
		if peers > 0 {
			s.warnRecreated(ctx, n, 0, ld)
		}
	}
	s.mu.Lock()
	s.seeded = true
	s.mu.Unlock()
	return nil
}

// insertLeases inserts the missing lease rows [from, to), unowned and
// expiring at exp, 1000 a statement.
func (s *Store) insertLeases(ctx context.Context, from, to int, exp int64) error {
	rows := make([]outbox.BucketLease, 0, to-from)
	for b := from; b < to; b++ {
		rows = append(rows, outbox.BucketLease{Bucket: int32(b), ExpiresAtMs: exp})
	}
	for chunk := range slices.Chunk(rows, 1000) {
		err := s.write(ctx, s.leases, func(q *gorm.DB) error {
			return q.Table(s.leases).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "bucket"}}, DoNothing: true}).
				Create(&chunk).Error
		})
		if err != nil {
			return fmt.Errorf("gormstore: create %d lease rows (from bucket %d): %w", len(rows), chunk[0].Bucket, err)
		}
	}
	return nil
}

// reseed recreates the lease rows missing from snap, unowned and not
// claimable before an earlier holder's lease has run out, and returns snap
// with them in bucket order.
func (s *Store) reseed(ctx context.Context, snap []outbox.BucketLease, now, ld int64) ([]outbox.BucketLease, error) {
	exp := now + ld
	n := s.cfg.BucketCount
	have := make([]bool, n)
	for _, l := range snap {
		have[l.Bucket] = true
	}
	var missing []int
	for b := range n {
		if !have[b] {
			missing = append(missing, b)
			snap = append(snap, outbox.BucketLease{Bucket: int32(b), ExpiresAtMs: exp})
		}
	}
	if err := s.insertLeases(ctx, missing[0], missing[len(missing)-1]+1, exp); err != nil {
		return nil, err
	}
	slices.SortFunc(snap, func(a, b outbox.BucketLease) int { return int(a.Bucket - b.Bucket) })
	s.warnRecreated(ctx, len(missing), missing[0], ld)
	return snap, nil
}

func (s *Store) warnRecreated(ctx context.Context, recreated, first int, ld int64) {
	s.log.WarnContext(ctx, "lease rows were missing (deleted by a restore or a cleanup?): recreated them, claimable once any earlier holder's lease has run out",
		"table", s.leases, "recreated", recreated, "first_bucket", first, "bucket_count", s.cfg.BucketCount, "claimable_in", time.Duration(ld)*time.Millisecond)
}

func (s *Store) free(ctx context.Context, relayID string, buckets []int) error {
	for _, set := range bucketSets(buckets) {
		err := s.write(ctx, s.leases, func(q *gorm.DB) error {
			return q.Table(s.leases).Where("owner = ?", relayID).Where(set.cond, set.args...).
				Updates(map[string]any{"owner": nil, "expires_at_ms": 0}).Error
		})
		if err != nil {
			return fmt.Errorf("gormstore: release %d leases: %w", set.n, err)
		}
	}
	return nil
}

// RenewBucketLeases implements relay.Store: a clock read, a heartbeat and
// guarded UPDATEs extending the leases relayID still holds (never
// backwards); only when they report fewer rows than buckets, a read tells a
// lost lease from an unchanged expiry (MySQL counts only changed rows).
func (s *Store) RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error) {
	if err := checkArgs(relayID, leaseDuration); err != nil {
		return false, err
	}
	now, err := s.nowMs(ctx)
	if err != nil {
		return false, err
	}
	exp := now + leaseDuration.Milliseconds()
	if err := s.heartbeat(ctx, relayID, now); err != nil {
		return false, err
	}
	if len(buckets) == 0 {
		return true, nil
	}
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	guard, guardArgs := s.liveRelay(relayID, now, leaseDuration)
	sets := bucketSets(buckets)
	var renewed int64
	for _, set := range sets {
		if err := s.write(ctx, s.leases, func(q *gorm.DB) error {
			res := q.Table(s.leases).
				Where("owner = ? AND expires_at_ms > ?", relayID, now).
				Where(set.cond, set.args...).
				Where(guard, guardArgs...).
				Update("expires_at_ms", notBackwards(exp))
			renewed += res.RowsAffected
			return res.Error
		}); err != nil {
			return false, fmt.Errorf("gormstore: renew %d leases: %w", set.n, err)
		}
	}
	if renewed == int64(len(buckets)) {
		return true, nil
	}
	var held int64
	for _, set := range sets {
		var n int64
		if err := s.read(ctx, s.leases, func(q *gorm.DB) error {
			return q.Table(s.leases).Where("owner = ? AND expires_at_ms >= ?", relayID, exp).Where(set.cond, set.args...).
				Count(&n).Error
		}); err != nil {
			return false, fmt.Errorf("gormstore: verify renewal: %w", err)
		}
		held += n
	}
	return held == int64(len(buckets)), nil
}

// ReleaseBucketLeases implements relay.Store: it stamps relayID stopped
// (its own late statements then change nothing) and frees its leases.
func (s *Store) ReleaseBucketLeases(ctx context.Context, relayID string) error {
	if err := checkArgs(relayID, time.Millisecond); err != nil {
		return err
	}
	now, err := s.nowMs(ctx)
	if err != nil {
		return err
	}
	err = s.write(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "relay_id"}},
			DoUpdates: clause.Set{{Column: clause.Column{Name: "stopped_at_ms"}, Value: now}},
		}).Create(&outbox.RelayHeartbeat{RelayID: relayID, LastSeenMs: now, StoppedAtMs: &now, Features: Features}).Error
	})
	if err != nil {
		return fmt.Errorf("gormstore: stamp %s stopped: %w", relayID, err)
	}
	err = s.write(ctx, s.leases, func(q *gorm.DB) error {
		return q.Table(s.leases).Where("owner = ?", relayID).
			Updates(map[string]any{"owner": nil, "expires_at_ms": 0}).Error
	})
	if err != nil {
		return fmt.Errorf("gormstore: release leases of %s: %w", relayID, err)
	}
	return nil
}

// bucketSet is one statement's share of a set of buckets: a condition on
// the bucket column and its arguments.
type bucketSet struct {
	cond string
	args []any
	n    int // buckets it covers
}

// bucketSets splits buckets into conditions of at most maxPerStatement
// bind variables: a run of three or more contiguous buckets is a range,
// the others an IN list.
func bucketSets(buckets []int) []bucketSet {
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	var out []bucketSet
	var conds []string
	var args []any
	var singles []int
	n, vars := 0, 0
	flush := func() {
		if len(singles) > 0 {
			conds = append(conds, "bucket IN ?")
			args = append(args, singles)
		}
		if len(conds) > 0 {
			out = append(out, bucketSet{cond: "(" + strings.Join(conds, " OR ") + ")", args: args, n: n})
		}
		conds, args, singles, n, vars = nil, nil, nil, 0, 0
	}
	for i := 0; i < len(buckets); {
		j := i + 1
		for j < len(buckets) && buckets[j] == buckets[j-1]+1 {
			j++
		}
		if j-i >= 3 {
			if vars+2 > maxPerStatement {
				flush()
			}
			conds = append(conds, "bucket >= ? AND bucket <= ?")
			args = append(args, buckets[i], buckets[j-1])
			vars += 2
			n += j - i
		} else {
			for _, b := range buckets[i:j] {
				if vars+1 > maxPerStatement {
					flush()
				}
				singles = append(singles, b)
				vars++
				n++
			}
		}
		i = j
	}
	flush()
	return out
}

// scanLeases appends the lease rows of buckets [0, n) to snap in bucket
// order, scanned by hand, their owners interned.
func (s *Store) scanLeases(q *gorm.DB, n int, snap *[]outbox.BucketLease) error {
	rows, err := q.Table(s.leases).Select("bucket, owner, expires_at_ms").
		Where("bucket >= ? AND bucket < ?", 0, n).Order("bucket").Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	var bucket, exp intCol
	var owner sql.RawBytes
	owners := map[string]*string{}
	for rows.Next() {
		if err := rows.Scan(&bucket, &owner, &exp); err != nil {
			return err
		}
		l := outbox.BucketLease{Bucket: int32(bucket.v), ExpiresAtMs: exp.v}
		if owner != nil {
			o, ok := owners[string(owner)]
			if !ok {
				str := string(owner)
				o = &str
				owners[str] = o
			}
			l.Owner = o
		}
		*snap = append(*snap, l)
	}
	return rows.Err()
}

// quietErrors is the user's GORM logger without failed statements: the
// relay logs each error once with its context.
type quietErrors struct{ logger.Interface }

func (q quietErrors) LogMode(l logger.LogLevel) logger.Interface {
	return quietErrors{q.Interface.LogMode(l)}
}

func (q quietErrors) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	if err != nil {
		return
	}
	q.Interface.Trace(ctx, begin, fc, nil)
}

// bucketsOutside selects the largest bucket below 0 (lo) and the smallest
// at or above BucketCount (hi) holding a row, NULL when none. Each probe
// moves away from the configured range, never walking the entries of rows
// being inserted. PostgreSQL: ORDER BY … LIMIT 1, as MIN/MAX scan the
// whole index on stale statistics; SQLite: a subquery per MIN or MAX.
func (s *Store) bucketsOutside(q *gorm.DB) *gorm.DB {
	t, n := clause.Table{Name: s.msgs}, s.cfg.BucketCount
	if s.db.Dialector.Name() == "postgres" {
		return q.Raw("SELECT (SELECT bucket FROM ? WHERE bucket < 0 ORDER BY bucket DESC LIMIT 1) AS lo, (SELECT bucket FROM ? WHERE bucket >= ? ORDER BY bucket LIMIT 1) AS hi", t, t, n)
	}
	return q.Raw("SELECT (SELECT MAX(bucket) FROM ? WHERE bucket < 0) AS lo, (SELECT MIN(bucket) FROM ? WHERE bucket >= ?) AS hi", t, t, n)
}

// bucketEnds selects the smallest and the largest bucket holding a row. It
// walks the entries of rows being inserted: only after bucketsOutside
// found rows outside.
func (s *Store) bucketEnds(q *gorm.DB) *gorm.DB {
	t := clause.Table{Name: s.msgs}
	if s.db.Dialector.Name() == "postgres" {
		return q.Raw("SELECT (SELECT bucket FROM ? ORDER BY bucket LIMIT 1) AS lo, (SELECT bucket FROM ? ORDER BY bucket DESC LIMIT 1) AS hi", t, t)
	}
	return q.Raw("SELECT (SELECT MIN(bucket) FROM ?) AS lo, (SELECT MAX(bucket) FROM ?) AS hi", t, t)
}
