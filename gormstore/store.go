// Package gormstore is the GORM-backed relay.Store: bucket leases, relay
// heartbeats and pending outbox rows kept in the three outbox tables on
// PostgreSQL, MySQL/MariaDB or SQLite. On SQLite, whose single writer
// serialises the relay's statements, set relay.Options.SingleWriter.
//
// Every lease step is a single guarded statement run in autocommit: no row
// lock is held across steps and no transaction stays open, so a slow relay
// never blocks its peers. Times are Unix milliseconds, and all comparisons
// are plain integer comparisons on every database. Table names come from the
// outbox.Config shared with outbox.Plugin and are quoted by GORM, never
// concatenated into SQL.
//
// # One clock: the database's
//
// Every time the store writes or compares in the lease, relay and park
// columns (lease expiries, heartbeats, stopped stamps, the liveness windows,
// pruning, parked_at_ms) comes from the database server's clock, not the
// relay host's: relays on hosts whose clocks disagree, by any amount, still
// agree on when a lease expires. Each acquisition round, renewal and
// release reads the database's time once (one SELECT) and uses it for all
// of its statements; Park and Fleet evaluate the clock
// inside their statement (see clock.go for why). Options.Clock, when set,
// replaces the database's clock (tests inject a manual clock).
//
// The relay host's clock still matters in two places, neither of them a
// lease: the relay bounds how long it trusts a lease by its own monotonic
// clock (a rate, not a reading), and created_at is stamped by the writers'
// hosts (outbox.Plugin), which the backlog-age gauges compare with the
// relay host's clock. Each clock read measures the host's offset to the
// database's clock, which the store reports in ClockOffset
// (the relay's outbox.clock.offset gauge).
//
// # Isolation
//
// Every read that decides what is published, deleted, owned or parked (the
// next batch, the pending-bucket probe, the lease snapshot and read-back,
// the active relays, the misconfiguration probe, the parked heads, the
// fleet's features) and the backlog metrics read
// only committed rows, whatever isolation level the pool's connections
// default to, so a relay never publishes a row whose transaction then rolls
// back, nor counts an uncommitted claim or heartbeat:
//
//   - PostgreSQL runs READ UNCOMMITTED as READ COMMITTED: the reads are plain
//     autocommit statements.
//   - MySQL and MariaDB: each read (or the three consecutive reads of an
//     acquisition round) runs in its own READ ONLY transaction at READ
//     COMMITTED, which the driver sets for that transaction alone
//     (SET TRANSACTION ISOLATION LEVEL, no session state). MariaDB refuses
//     tx_isolation in SET STATEMENT and MySQL has no per-statement form.
//   - SQLite: a connection reads uncommitted rows only in shared-cache mode
//     with PRAGMA read_uncommitted; the store does not support shared cache
//     (without the pragma, its readers fail with "database table is locked"
//     while a writer's transaction is open). With the default private cache
//     every read is of committed data.
//
// Writes are single autocommit statements, except RequeueParked and
// DeleteParked on PostgreSQL and MySQL/MariaDB: each is one READ COMMITTED
// transaction that locks rows (SELECT … FOR UPDATE) before it changes them.
// Each row a write changes is matched against its latest committed version (PostgreSQL
// re-checks it after a concurrent writer commits; InnoDB uses locking or
// semi-consistent reads).
// The liveness guard of a lease write also reads the relay's own heartbeat
// row, which only that relay's own statements write.
//
// # The primary
//
// Every statement of the store, reads included, runs on the primary, whatever
// read/write-splitting resolver is registered on the *gorm.DB: each carries
// the setting "gorm:db_resolver:write" (what gorm.io/plugin/dbresolver's
// Write clause sets; the store does not import dbresolver), and, when a
// callback named "gorm:db_resolver" is registered, the store asks it for the
// source pool first, so that its transactions (which dbresolver never
// switches) also begin on the primary. A replica, however fresh, is never
// read: a lease read-back or a batch from a lagging replica would flap
// ownership and publish deleted rows again. A resolver of another name must
// honour the same setting or not split the outbox tables. nextBatch and
// MarkPublished run on that same resolved pool, straight through
// database/sql (see "The hot path" in hotpath.go), so they bypass GORM's
// callbacks: a resolver of another name is not asked for them, and they
// run on the *gorm.DB's own pool.
//
// # Parking
//
// The store parks rows (relay.Store.Park) and implements relay.ParkAdmin. A parked row stays
// in the messages table with parked_at_ms (Unix ms, UTC, the database's clock)
// and parked_reason (at most 1000 characters) set; only the relay (through
// the store) writes them, never outbox.Message creates or updates. The read
// index is (bucket, parked_at_ms, id): nextBatch and BucketsWithPending read
// the unparked entries of one bucket (parked_at_ms IS NULL) and never touch
// the parked ones, except that nextBatch, when the bucket has a parked row,
// looks up the parked rows of each row's key (see nextBatch);
// ListParked, RequeueParked and DeleteParked read the parked entries. The relays table's features column carries
// Features with every heartbeat; Fleet reports CanPark false while a live relay's
// row lacks the parking bit.
//
// Upgrade order: apply the schema change first (outbox.AutoMigrate, or
// migrations/<dialect>/000002_parking.up.sql: nullable columns, a column
// with a default and the new index; the old (bucket, id) index is dropped),
// then deploy the new relays. Relays of the previous version keep working on
// the new schema (they never write the new columns, and their heartbeats
// keep features 0), and no row is parked while any of them is live, so a
// rolling upgrade never lets an old relay publish a parked row. Downgrade
// only after requeueing or deleting every parked row (ParkAdmin), with the
// new relays stopped: an old relay would publish parked rows out of order.
//
// # Session state
//
// No statement depends on or leaves session state (no SET SESSION, no
// temporary table, no prepared statement of the store's own): the store works
// behind PgBouncer in transaction pooling mode. Isolation and timeouts are set
// per transaction (SET TRANSACTION) or per statement (SET STATEMENT … FOR).
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

// Clock is the time source the store reads (only Now): relay.Clock and
// relaytest.ManualClock satisfy it, so a test gives the store the relay's
// clock.
type Clock interface {
	Now() time.Time
}

// Options configures a Store. A zero Options means the default outbox.Config
// (8 buckets, default table names), the database's clock and a one-minute
// prune interval.
type Options struct {
	// Config names the outbox tables and the bucket count. Share the value
	// given to outbox.Plugin: writers and relays must agree. The zero Config
	// means outbox's defaults; an invalid Config fails New.
	Config outbox.Config
	// Clock, when set, replaces the database's clock: lease expiries,
	// heartbeats, stopped stamps, liveness windows, pruning and parked_at_ms
	// are its Unix milliseconds. Nil (production) means the database
	// server's clock, read once per acquisition round, renewal and release,
	// so that relays whose host clocks disagree still agree on every lease.
	// Tests inject the relay's manual clock (relaytest.ManualClock; any
	// relay.Clock will do: only Now is read). A dialect other than
	// PostgreSQL, MySQL/MariaDB and SQLite has no known clock expression:
	// New fails unless Clock is set.
	Clock Clock
	// HostClock is the relay host's wall clock, against which each read of
	// the store's clock measures the offset that ClockOffset reports. Nil
	// means the system clock. Leases never use it; tests inject a skewed
	// clock.
	HostClock Clock
	// PruneInterval is the least time between two deletions of stale
	// heartbeat rows (relays unseen for 10 × the lease duration, stopped
	// relays after 1 × the lease duration), done as part of an acquisition
	// round. Zero means DefaultPruneInterval (1m); a negative value fails New.
	PruneInterval time.Duration
	// StatementTimeout bounds every statement of the store (and each read
	// transaction of MySQL/MariaDB as a whole): a statement blocked on a lock
	// (a migration holding the messages table) or a stuck connection becomes
	// an error the relay reports in Health and backs off from. It is a
	// context deadline per statement, never session state (safe behind
	// PgBouncer's transaction pooling), and ends the statement on the server
	// too: on PostgreSQL pgx sends a cancel request when the deadline passes;
	// on MariaDB each statement carries SET STATEMENT max_statement_time,
	// lock_wait_timeout and innodb_lock_wait_timeout, with the deadline a
	// fifth of the timeout (at most 1s) later. On SQLite a write waiting for
	// another writer is bounded by the DSN's _busy_timeout instead: keep it
	// at most StatementTimeout. Zero means DefaultStatementTimeout (5s); a
	// negative value fails New. Keep it well under the relay's
	// LeaseRenewInterval.
	StatementTimeout time.Duration
	// Logger receives the store's own warnings (lease rows it had to
	// recreate). Nil means slog.Default().
	Logger *slog.Logger
}

// Store is a relay.Store and a relay.ParkAdmin on a *gorm.DB, with an
// inspection API for operators (inspect.go) and the bucket-count change
// (Rebucket). Any bucket count up to outbox.MaxBucketCount
// works on every dialect: statements over a set of buckets are split so
// that none exceeds a dialect's bind-variable limit. It is safe for
// concurrent use; each relay should have its own Store (the store remembers
// whether it seeded the lease rows and when it last pruned heartbeats).
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

// AcquireBucketLeases implements relay.Store. One round is, each a single
// statement: reading the database's clock (unless Options.Clock is set);
// heartbeat upsert (and, at most once per PruneInterval, a
// delete of stale heartbeats); seeding the lease rows (until it succeeded
// once); the misconfiguration probe; the active relays; the lease snapshot;
// extending the kept leases; releasing the excess (only when there is
// some); claiming free or expired buckets (only when short of the share);
// and reading back what this relay owns.
//
// When one of the store's tables is missing before its first successful
// round, the error names it and wraps relay.ErrMisconfigured, which stops
// the relay: a deployment without its tables fails loudly. A table that
// goes missing later (renamed during a migration, say) fails the rounds,
// which the relay retries until it is back.
//
// Each round (and each delete, at most once a second) also checks the
// pool's idle room (poolwatch.go): a pool that closed poolWatchCloses
// connections for want of it within 30 s is named in a warning, at most
// once an hour.
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
		// Rows outside [0, n): one probe of the index on each side, which
		// reads only the entries outside the range (bucketsOutside).
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

// Features is the capability bit set the store writes with every heartbeat
// (the relays table's features column): parking. A relay of a version
// without the column's support leaves 0 in its row, which makes
// Fleet report CanPark false while it is live.
const Features = outbox.RelayFeatureParking

// heartbeat upserts relayID's last-seen, never moving it backwards, and
// clears its stopped stamp unless the stamp is not older than now: a late
// heartbeat from before a release does not revive the relay. It writes the
// Features bits too.
func (s *Store) heartbeat(ctx context.Context, relayID string, now int64) error {
	last := clause.Column{Table: s.relays, Name: "last_seen_ms"}
	stopped := clause.Column{Table: s.relays, Name: "stopped_at_ms"}
	err := s.write(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).Clauses(clause.OnConflict{
			Columns: []clause.Column{{Name: "relay_id"}},
			DoUpdates: clause.Set{
				// stopped_at_ms first: MySQL evaluates assignments left to right
				// and would otherwise see the new last_seen_ms. Neither
				// expression reads the other column, so order is only safety.
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

// seed checks, in the store's first round, that the lease table holds
// this store's bucket count (rows 0…N−1: its largest bucket is N−1), and
// seeds an empty one: the free rows 0…N−1, or, when another relay is live
// (the table was emptied under a running fleet), rows that no relay can
// claim before exp, when any earlier holder's lease has run out. A
// statement per thousand rows, each bounded by the statement timeout, so
// that a slow database seeds 65,536 rows over a few rounds.
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

// insertLeases inserts the lease rows [from, to) that do not exist yet,
// with no owner and expiring at exp, a statement per thousand rows.
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

// reseed recreates the lease rows missing from snap with no owner, not
// claimable before exp (now + the lease duration: an earlier holder may
// still believe its lease valid until then), and returns snap with them,
// in bucket order. A row another relay recreated meanwhile is kept.
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

// RenewBucketLeases implements relay.Store: a read of the database's
// clock (unless Options.Clock is set), a heartbeat, one guarded
// UPDATE extending the leases relayID still holds unexpired (never
// backwards), and, only when the UPDATE reports fewer rows than buckets, a
// read that tells a lost lease from a row whose expiry was already far
// enough (MySQL counts only changed rows). It returns false when any bucket
// was lost; the leases still held are then extended all the same.
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

// ReleaseBucketLeases implements relay.Store: it reads the
// database's clock (unless Options.Clock is set), stamps relayID stopped (so that its own late statements change nothing), then frees its
// leases (owner NULL, expiry 0).
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

// bucketSets splits buckets (any order, duplicates allowed) into
// conditions of at most maxPerStatement bind variables each, so that a
// statement stays under every dialect's limit (SQLite: 32,766 host
// parameters; PostgreSQL and MySQL: 65,535) whatever the bucket count: a
// contiguous run of three or more buckets is one range (bucket >= ? AND
// bucket <= ?, two variables however long the run), the others go in an
// IN list. A relay holding every bucket, or a contiguous share, needs one
// statement.
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

// scanLeases appends the lease rows of buckets [0, n) to snap, in bucket
// order, scanned by hand (no reflection per row: an acquisition round
// reads up to 65,536 of them). The owners are interned: a relay's id is
// one string however many buckets it holds.
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

// quietErrors is the GORM logger of the store's statements: the user's,
// except that a failed statement is not reported through it. Its error is
// returned to the relay, which logs it once with its context (the bucket,
// the backoff); through GORM's logger it would also print at ERROR with
// the full SQL on every attempt, every second while the database is down.
// Successful statements are traced as before (SQL at the user's level,
// slow queries).
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

// bucketsOutside selects a bucket outside [0, BucketCount) holding a row
// on each side: the largest below 0 as lo and the smallest at or above
// BucketCount as hi (each NULL when there is none). Each is one probe of
// the (bucket, parked_at_ms, id) index that starts at the edge of the
// range and moves away from the configured buckets, so it reads only the
// entries of rows outside them: normally none. A probe of the index's
// ends (the smallest and the largest bucket of all, or a range probe
// moving towards the configured buckets) first passes the entries a
// transaction inserting rows has not committed: invisible to it, each
// checked in the table (PostgreSQL) or the undo log (InnoDB). With
// 1,000,000 rows being inserted, every acquisition round of every relay
// spent 1.6–1.9 s walking them on PostgreSQL, about a sixth of a database
// core per idle relay; 200,000 rows: 89 ms on PostgreSQL, 420 ms on
// MariaDB (TestMisconfigurationProbeSkipsRowsBeingInserted). On
// PostgreSQL not MAX and MIN: with statistics that record no rows in many
// pages (ANALYZE of a drained table) PostgreSQL aggregates a scan of the
// whole index instead, 540-940 ms at 200,000 rows
// (TestHotPathDeletesByLocationAfterADrainWasAnalyzed). On MySQL, MariaDB
// and SQLite MAX and MIN are one index lookup already ("Select tables
// optimized away"); SQLite optimizes one MIN or MAX per query, hence a
// subquery each.
func (s *Store) bucketsOutside(q *gorm.DB) *gorm.DB {
	t, n := clause.Table{Name: s.msgs}, s.cfg.BucketCount
	if s.db.Dialector.Name() == "postgres" {
		return q.Raw("SELECT (SELECT bucket FROM ? WHERE bucket < 0 ORDER BY bucket DESC LIMIT 1) AS lo, (SELECT bucket FROM ? WHERE bucket >= ? ORDER BY bucket LIMIT 1) AS hi", t, t, n)
	}
	return q.Raw("SELECT (SELECT MAX(bucket) FROM ? WHERE bucket < 0) AS lo, (SELECT MIN(bucket) FROM ? WHERE bucket >= ?) AS hi", t, t, n)
}

// bucketEnds selects the smallest and the largest bucket holding a row, as
// lo and hi (NULL when the table is empty), as bucketsOutside does (the
// same statements without their bounds); it walks the entries of rows
// being inserted, so it runs only when bucketsOutside found rows outside
// [0, BucketCount).
func (s *Store) bucketEnds(q *gorm.DB) *gorm.DB {
	t := clause.Table{Name: s.msgs}
	if s.db.Dialector.Name() == "postgres" {
		return q.Raw("SELECT (SELECT bucket FROM ? ORDER BY bucket LIMIT 1) AS lo, (SELECT bucket FROM ? ORDER BY bucket DESC LIMIT 1) AS hi", t, t)
	}
	return q.Raw("SELECT (SELECT MIN(bucket) FROM ?) AS lo, (SELECT MAX(bucket) FROM ?) AS hi", t, t)
}
