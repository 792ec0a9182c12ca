package gormstore_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
)

// dbClockMs reads the database server's clock in Unix milliseconds with an
// expression of its own, independent of the store's.
func dbClockMs(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	var q string
	switch db.Dialector.Name() {
	case "postgres":
		q = "SELECT floor(extract(epoch from statement_timestamp()) * 1000)::bigint"
	case "mysql":
		q = "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
	case "sqlite":
		q = "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	default:
		t.Fatalf("no clock query for %s", db.Dialector.Name())
	}
	var ms int64
	if err := db.Raw(q).Row().Scan(&ms); err != nil {
		t.Fatalf("read the database clock: %v", err)
	}
	return ms
}

// skewed returns a host clock offset by d from the real one.
func skewed(d time.Duration) gormstore.Clock {
	return nowFunc(func() time.Time { return time.Now().Add(d) })
}

// nowFunc is a gormstore.Clock reading a function.
type nowFunc func() time.Time

func (f nowFunc) Now() time.Time { return f() }

// clockOf is now as a gormstore.Clock; nil (the database's clock) for nil.
func clockOf(now func() time.Time) gormstore.Clock {
	if now == nil {
		return nil
	}
	return nowFunc(now)
}

// clockTolerance absorbs the two clock expressions' rounding (to the
// millisecond) and, for PostgreSQL, statement_timestamp being taken when
// the statement arrives.
const clockTolerance = 2

// TestLeasesRunOnTheDatabaseClock: with Options.Clock nil, the expiry an
// acquisition writes is the database's time during the call plus the lease
// duration, and the heartbeat its time, whatever the host clock says (here
// 40 s fast). On MySQL/MariaDB also under a session time_zone far from
// UTC. This is clock agreement, not speed: the bounds are two reads of the
// database's clock around the call.
func TestLeasesRunOnTheDatabaseClock(t *testing.T) {
	const ld = 30 * time.Second
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			if o.Name == testenv.MySQL {
				// One connection, so that the session time zone set here is
				// the one every statement of the store and the test runs in.
				sqlDB, err := db.DB()
				if err != nil {
					t.Fatal(err)
				}
				sqlDB.SetMaxOpenConns(1)
				sqlDB.SetMaxIdleConns(1)
				sqlDB.SetConnMaxLifetime(0)
				sqlDB.SetConnMaxIdleTime(0)
				testenv.MustExec(t, db, "SET time_zone = '+09:30'")
			}
			cfg := newConfig(t, db, 4)
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: skewed(40 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			before := dbClockMs(t, db)
			got, err := relaytest.Owned(s.AcquireBucketLeases(t.Context(), "relay-a", 4, ld))
			if err != nil {
				t.Fatal(err)
			}
			after := dbClockMs(t, db)
			if len(got) != 4 {
				t.Fatalf("owns %v; want all 4 buckets", got)
			}
			var leases []outbox.BucketLease
			if err := db.Table(cfg.LeasesTableName()).Order("bucket").Find(&leases).Error; err != nil {
				t.Fatal(err)
			}
			for _, l := range leases {
				if e := l.ExpiresAtMs - ld.Milliseconds(); e < before-clockTolerance || e > after+clockTolerance {
					t.Errorf("bucket %d expires at %d = database time %d + lease; want database time in [%d, %d] (the host clock says %d)",
						l.Bucket, l.ExpiresAtMs, e, before, after, skewed(40*time.Second).Now().UnixMilli())
				}
			}
			var hb outbox.RelayHeartbeat
			if err := db.Table(cfg.RelaysTableName()).Where("relay_id = ?", "relay-a").Take(&hb).Error; err != nil {
				t.Fatal(err)
			}
			if hb.LastSeenMs < before-clockTolerance || hb.LastSeenMs > after+clockTolerance {
				t.Errorf("heartbeat at %d; want database time in [%d, %d]", hb.LastSeenMs, before, after)
			}
			// Released: the stopped stamp is the database's time too.
			before = dbClockMs(t, db)
			if err := s.ReleaseBucketLeases(t.Context(), "relay-a"); err != nil {
				t.Fatal(err)
			}
			after = dbClockMs(t, db)
			if err := db.Table(cfg.RelaysTableName()).Where("relay_id = ?", "relay-a").Take(&hb).Error; err != nil {
				t.Fatal(err)
			}
			if hb.StoppedAtMs == nil || *hb.StoppedAtMs < before-clockTolerance || *hb.StoppedAtMs > after+clockTolerance {
				t.Errorf("stopped at %v; want database time in [%d, %d]", hb.StoppedAtMs, before, after)
			}
			off, unc, ok := s.ClockOffset()
			t.Logf("%s: host clock +40s: ClockOffset = %v ± %v (ok %v)", o.Name, off, unc, ok)
		})
	}
}

// TestParkingStampsRunOnTheDatabaseClock: parked_at_ms is the database's
// time when Options.Clock is nil, and Fleet judges liveness by it: a
// relay whose heartbeat the database clock calls live, and that lacks the
// parking bit, blocks parking even for a store whose host clock is far off.
func TestParkingStampsRunOnTheDatabaseClock(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 2)
			s, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: skewed(-40 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			m := &outbox.Message{MessageID: outbox.NewUUID(), Bucket: 1, Topic: "t", Key: []byte("k"), CreatedAt: time.Now().UTC()}
			if err := db.Session(&gorm.Session{SkipHooks: true}).Table(cfg.MessagesTableName()).Create(m).Error; err != nil {
				t.Fatal(err)
			}
			if _, err := s.AcquireBucketLeases(t.Context(), "relay-a", 2, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			before := dbClockMs(t, db)
			if err := s.Park(t.Context(), "relay-a", 1, m.ID, "test"); err != nil {
				t.Fatal(err)
			}
			after := dbClockMs(t, db)
			var at int64
			if err := db.Table(cfg.MessagesTableName()).Where("id = ?", m.ID).Select("parked_at_ms").Row().Scan(&at); err != nil {
				t.Fatal(err)
			}
			if at < before-clockTolerance || at > after+clockTolerance {
				t.Errorf("parked at %d; want database time in [%d, %d]", at, before, after)
			}
			// An old relay (features 0) seen 10 s ago by the database's clock:
			// live for the default window (30 s), so parking is off.
			old := outbox.RelayHeartbeat{RelayID: "old", LastSeenMs: dbClockMs(t, db) - 10_000}
			if err := db.Table(cfg.RelaysTableName()).Create(&old).Error; err != nil {
				t.Fatal(err)
			}
			if f, err := s.Fleet(t.Context()); err != nil || f.CanPark {
				t.Fatalf("Fleet = %+v, %v with an old relay seen 10s ago; want CanPark false", f, err)
			}
			if err := db.Table(cfg.RelaysTableName()).Where("relay_id = ?", "old").Update("last_seen_ms", dbClockMs(t, db)-40_000).Error; err != nil {
				t.Fatal(err)
			}
			if f, err := s.Fleet(t.Context()); err != nil || !f.CanPark {
				t.Fatalf("Fleet = %+v, %v with the old relay last seen 40s ago; want CanPark", f, err)
			}
		})
	}
}

// skewRelay is one simulated relay of the skewed-clock run and what it
// believes it owns: the buckets of its last acquisition or renewal, valid
// until expiry, which, like the relay's own monotonic bound, counts the
// lease from just before the call (here on the database's clock, on which
// the run judges who is live).
type skewRelay struct {
	id     string
	skew   time.Duration
	s      *gormstore.Store
	owned  []int
	expiry int64 // database Unix ms
	paused int   // rounds left without acting; -1: released (stopped), rejoins later
	until  int64 // with paused > 0: paused until the database clock passes it (Unix ms); 0: for paused rounds
	rounds int   // rounds after which it owned at least one bucket
	// What it did, told when it is starved: acquisition calls, those that
	// answered no bucket, rounds spent paused or released.
	calls, empty, idle int
}

// TestRelaysWithSkewedHostClocksNeverShareABucket: relays whose host clocks
// are 40 s fast, exact and 40 s slow (twice the old tolerance of
// LeaseDuration − LeaseRenewInterval) run randomised acquisition rounds,
// renewals, pauses past their lease and releases on one database, with
// Options.Clock nil: after every round no bucket has two live owners, live
// judged by the database's clock, and the lease table names each live owner
// until at least its believed expiry. Leases last about 40 acquisition
// calls (measured first), so that they expire while the run goes on, past a
// pause of some dozens of rounds; nothing sleeps. Every relay owns buckets
// in many rounds (none is starved), they converge to a fair partition at
// the end (with long leases, so that a slow machine cannot expire them
// between the last rounds),
// and each store's ClockOffset is its host skew, negated, within the
// measured uncertainty plus a margin.
func TestRelaysWithSkewedHostClocksNeverShareABucket(t *testing.T) {
	const (
		n      = 8
		rounds = 600
		margin = 250 * time.Millisecond // the database host's own offset to this one, and scheduling
	)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("STORETEST_SEED"); v != "" {
		if s, err := strconv.ParseUint(v, 10, 64); err == nil {
			seed = s
		}
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			t.Logf("seed %d (set STORETEST_SEED to replay)", seed)
			rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
			ctx := t.Context()
			db := o.Open(t, nil)
			cfg := newConfig(t, db, n)
			var relays []*skewRelay
			for i, skew := range []time.Duration{40 * time.Second, 0, -40 * time.Second} {
				s, err := gormstore.New(db, gormstore.Options{Config: cfg, HostClock: skewed(skew)})
				if err != nil {
					t.Fatal(err)
				}
				relays = append(relays, &skewRelay{id: fmt.Sprintf("relay-%d(%+v)", i, skew), skew: skew, s: s})
			}
			// The lease: about 40 acquisition calls.
			began := time.Now()
			for range 10 {
				if _, err := relays[0].s.AcquireBucketLeases(ctx, relays[0].id, n, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			ld := min(max(time.Since(began)*4, 30*time.Millisecond), 3*time.Second).Round(time.Millisecond)
			if err := relays[0].s.ReleaseBucketLeases(ctx, relays[0].id); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: lease duration %v", o.Name, ld)
			acquire := func(round int, rs []*skewRelay) {
				t.Helper()
				start := dbClockMs(t, db)
				got := make([][]int, len(rs))
				errs := make([]error, len(rs))
				var wg sync.WaitGroup
				for i, r := range rs {
					wg.Go(func() { got[i], errs[i] = relaytest.Owned(r.s.AcquireBucketLeases(ctx, r.id, n, ld)) })
				}
				wg.Wait()
				for i, r := range rs {
					if errs[i] != nil {
						t.Fatalf("round %d: AcquireBucketLeases(%s): %v", round, r.id, errs[i])
					}
					r.owned, r.expiry = got[i], start+ld.Milliseconds()
					r.calls++
					if len(got[i]) == 0 {
						r.empty++
					}
				}
			}
			counts := map[string]int{}
			last := map[int32]string{} // bucket → its owner in the lease table after the previous round
			for round := range rounds {
				var live []*skewRelay
				for _, r := range relays {
					switch {
					case r.paused > 0 && r.until != 0:
						if dbClockMs(t, db) > r.until {
							r.paused, r.until = 0, 0
						}
					case r.paused > 0:
						r.paused--
					case r.paused < 0 && rng.IntN(20) == 0:
						r.paused, r.owned = 0, nil // restarts under its old id
						counts["restart"]++
					}
					if r.paused == 0 {
						live = append(live, r)
					} else {
						r.idle++
					}
				}
				if len(live) == 0 {
					continue
				}
				switch p := rng.IntN(100); {
				case p < 45:
					acquire(round, live[rng.IntN(len(live)):][:1])
					counts["acquire"]++
				case p < 65:
					acquire(round, live)
					counts["concurrent"]++
				case p < 77:
					r := live[rng.IntN(len(live))]
					if len(r.owned) == 0 {
						continue
					}
					start := dbClockMs(t, db)
					held, err := r.s.RenewBucketLeases(ctx, r.id, r.owned, ld)
					if err != nil {
						t.Fatalf("round %d: RenewBucketLeases(%s): %v", round, r.id, err)
					}
					if held {
						r.expiry = start + ld.Milliseconds()
						counts["renewed"]++
					} else {
						r.owned = nil // the relay treats any loss as losing all
						counts["renewal lost"]++
					}
				case p < 85 && len(live) > 1:
					// One of several paused for a while: keeps its belief (a zombie until its
					// expiry, which the others must wait out). Every other pause lasts past
					// its lease on the database's clock, however long the rounds take, so
					// that the run exercises takeovers whatever the machine's load (a pause
					// counted in rounds alone could end before a lease measured when the
					// machine was slower).
					r := live[rng.IntN(len(live))]
					r.paused = 10 + rng.IntN(120)
					if rng.IntN(2) == 0 {
						r.until = max(r.expiry, dbClockMs(t, db)) + ld.Milliseconds()/2
					}
					counts["pause"]++
				case p >= 85 && p < 89 && len(live) > 1:
					r := live[rng.IntN(len(live))]
					if err := r.s.ReleaseBucketLeases(ctx, r.id); err != nil {
						t.Fatalf("round %d: ReleaseBucketLeases(%s): %v", round, r.id, err)
					}
					r.owned, r.paused = nil, -1
					counts["release"]++
				}
				checkSkewOwners(t, db, cfg, round, relays, last, counts)
			}
			t.Logf("%s: after %d rounds: %v", o.Name, rounds, counts)
			if counts["takeover"] == 0 {
				t.Errorf("no bucket passed from one relay to another after its lease expired; want the run to exercise takeovers")
			}
			for _, r := range relays {
				if r.rounds < rounds/20 {
					t.Errorf("%s owned buckets after only %d of %d rounds (%d acquisition calls, %d answered none; %d rounds paused or released); want no relay starved",
						r.id, r.rounds, rounds, r.calls, r.empty, r.idle)
				}
			}
			// Everyone back: every lease owner takes part, so they converge
			// without waiting for an expiry.
			for _, r := range relays {
				r.paused = 0
			}
			ld = time.Minute
			for range 4 {
				for _, r := range relays {
					acquire(rounds, []*skewRelay{r})
				}
			}
			checkSkewOwners(t, db, cfg, rounds, relays, last, counts)
			total, lo, hi := 0, n, 0
			for _, r := range relays {
				total += len(r.owned)
				lo, hi = min(lo, len(r.owned)), max(hi, len(r.owned))
			}
			if total != n || hi-lo > 1 {
				t.Errorf("after settling the relays own %d buckets, shares %d..%d; want all %d, differing by at most 1", total, lo, hi, n)
			}
			for _, r := range relays {
				off, unc, ok := r.s.ClockOffset()
				t.Logf("%s: %s: ClockOffset = %v ± %v", o.Name, r.id, off, unc)
				if !ok {
					t.Errorf("%s: ClockOffset not reported after acquisitions", r.id)
					continue
				}
				if d := (off + r.skew).Abs(); d > unc+margin {
					t.Errorf("%s: ClockOffset = %v ± %v; want %v within the uncertainty + %v", r.id, off, unc, -r.skew, margin)
				}
			}
		})
	}
}

// checkSkewOwners fails if a bucket has two live owners by the database's
// clock, or if the lease table does not name a live owner until at least
// its believed expiry. It counts, for each relay, the rounds it owned
// buckets after, and in counts["takeover"] the buckets whose owner in the
// table changed from one relay to another since the previous round (last),
// without being freed in between: a claim of an expired lease.
func checkSkewOwners(t *testing.T, db *gorm.DB, cfg outbox.Config, round int, relays []*skewRelay, last map[int32]string, counts map[string]int) {
	t.Helper()
	now := dbClockMs(t, db)
	owner := map[int]*skewRelay{}
	for _, r := range relays {
		if r.expiry <= now || len(r.owned) == 0 {
			continue
		}
		r.rounds++
		for _, b := range r.owned {
			if o, ok := owner[b]; ok {
				t.Fatalf("round %d: bucket %d has two live owners by the database clock (%d): %s until %d and %s until %d",
					round, b, now, o.id, o.expiry, r.id, r.expiry)
			}
			owner[b] = r
		}
	}
	var leases []outbox.BucketLease
	if err := db.Table(cfg.LeasesTableName()).Order("bucket").Find(&leases).Error; err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		cur := ""
		if l.Owner != nil {
			cur = *l.Owner
		}
		if prev := last[l.Bucket]; prev != "" && cur != "" && prev != cur {
			counts["takeover"]++
		}
		last[l.Bucket] = cur
		r, ok := owner[int(l.Bucket)]
		if !ok {
			continue
		}
		if l.Owner == nil || *l.Owner != r.id || l.ExpiresAtMs < r.expiry {
			t.Fatalf("round %d: lease table has bucket %d owned by %v until %d; want %s until at least %d",
				round, l.Bucket, l.Owner, l.ExpiresAtMs, r.id, r.expiry)
		}
	}
}

// TestTheDatabaseClockCostsOneStatementPerLeaseOperation measures the price
// of the database's clock: an idle acquisition round, a renewal and a
// release each run exactly one statement more (the clock read) than with
// an injected Options.Clock, and Park and Fleet none.
func TestTheDatabaseClockCostsOneStatementPerLeaseOperation(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx := t.Context()
			db, c := countingDB(t, o)
			count := func(what string, f func() error) int {
				t.Helper()
				c.start()
				err := f()
				stmts := c.stop()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				return len(stmts)
			}
			run := func(now func() time.Time) map[string]int {
				cfg := newConfig(t, db, 4)
				s, err := gormstore.New(db, gormstore.Options{Config: cfg, Clock: clockOf(now)})
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]int{}
				var owned []int
				acquire := func() error {
					var err error
					owned, err = relaytest.Owned(s.AcquireBucketLeases(ctx, "relay-a", 4, 30*time.Second))
					return err
				}
				count("first round", acquire)
				got["idle round"] = count("idle round", acquire)
				got["renew"] = count("renew", func() error { _, err := s.RenewBucketLeases(ctx, "relay-a", owned, 30*time.Second); return err })
				m := &outbox.Message{MessageID: outbox.NewUUID(), Bucket: 1, Topic: "t", CreatedAt: time.Now().UTC()}
				if err := db.Session(&gorm.Session{SkipHooks: true}).Table(cfg.MessagesTableName()).Create(m).Error; err != nil {
					t.Fatal(err)
				}
				got["fleet can park"] = count("fleet can park", func() error { _, err := s.Fleet(ctx); return err })
				got["park"] = count("park", func() error { return s.Park(ctx, "relay-a", 1, m.ID, "test") })
				got["release"] = count("release", func() error { return s.ReleaseBucketLeases(ctx, "relay-a") })
				return got
			}
			injected := run(time.Now)
			database := run(nil)
			t.Logf("%s: statements with Options.Clock %v; with the database's clock %v", o.Name, injected, database)
			for op, n := range injected {
				want := n
				if op == "idle round" || op == "renew" || op == "release" {
					want++
				}
				if database[op] != want {
					t.Errorf("%s: %d statements on the database's clock, %d with Options.Clock; want %d", op, database[op], n, want)
				}
			}
		})
	}
}
