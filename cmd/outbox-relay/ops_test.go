package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// opsFixture is one outbox (its three tables) on a test database, for the
// status, check and rebucket tests.
type opsFixture struct {
	db     *gorm.DB
	cfg    outbox.Config
	driver string
	// flags are the database flags that name it, as an operator passes them.
	flags []string
}

// newOpsFixture creates the tables of an outbox named prefix (prefix_messages,
// …) with buckets buckets on db.
func newOpsFixture(t *testing.T, db *gorm.DB, prefix string, buckets int) *opsFixture {
	t.Helper()
	cfg := outbox.Config{BucketCount: buckets, MessagesTable: prefix + "_messages", LeasesTable: prefix + "_leases", RelaysTable: prefix + "_relays"}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatalf("AutoMigrate %s: %v", prefix, err)
	}
	if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil { // each test writes the leases it needs
		t.Fatal(err)
	}
	driver, dsn := dsnOf(t, db)
	return &opsFixture{db: db, cfg: cfg, driver: driver, flags: []string{
		"-db-driver", driver, "-db-dsn", dsn, "-bucket-count", fmt.Sprint(buckets),
		"-messages-table", cfg.MessagesTable, "-leases-table", cfg.LeasesTable, "-relays-table", cfg.RelaysTable,
	}}
}

// enqueue writes a row pinned to partition p, so to bucket p mod count
// (count: the fixture's bucket count when 0), created at createdAt, as a
// writer with that count would.
func (f *opsFixture) enqueue(t *testing.T, count int, p int32, key string, createdAt time.Time) int64 {
	t.Helper()
	cfg := f.cfg
	if count > 0 {
		cfg.BucketCount = count
	}
	m := &outbox.Message{Topic: "orders", Key: []byte(key), Value: []byte("v"), Partition: &p, CreatedAt: createdAt}
	if err := f.db.Scopes(outbox.WithConfig(cfg)).Create(m).Error; err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return m.ID
}

// enqueueKeys writes one keyless-partition row per key, as a writer with
// count buckets would (the key decides the bucket).
func (f *opsFixture) enqueueKeys(t *testing.T, count int, keys ...string) {
	t.Helper()
	cfg := f.cfg
	cfg.BucketCount = count
	for _, k := range keys {
		if err := f.db.Scopes(outbox.WithConfig(cfg)).Create(outbox.NewStringMessage("orders", k, "v")).Error; err != nil {
			t.Fatalf("enqueue %q: %v", k, err)
		}
	}
}

// park marks row id parked at parkedAt.
func (f *opsFixture) park(t *testing.T, id int64, parkedAt time.Time) {
	t.Helper()
	if err := f.db.Table(f.cfg.MessagesTableName()).Where("id = ?", id).
		Updates(map[string]any{"parked_at_ms": parkedAt.UnixMilli(), "parked_reason": "broker: message too large"}).Error; err != nil {
		t.Fatalf("park %d: %v", id, err)
	}
}

// lease writes bucket's lease row: owner ("" for none) until expires.
func (f *opsFixture) lease(t *testing.T, bucket int, owner string, expires time.Time) {
	t.Helper()
	row := map[string]any{"bucket": bucket, "owner": nil, "expires_at_ms": 0}
	if owner != "" {
		row["owner"], row["expires_at_ms"] = owner, expires.UnixMilli()
	}
	if err := f.db.Table(f.cfg.LeasesTableName()).Create(row).Error; err != nil {
		t.Fatalf("lease row %d: %v", bucket, err)
	}
}

// heartbeat writes a relay's heartbeat row; stopped zero means running.
func (f *opsFixture) heartbeat(t *testing.T, id string, lastSeen, stopped time.Time, features int64) {
	t.Helper()
	row := map[string]any{"relay_id": id, "last_seen_ms": lastSeen.UnixMilli(), "stopped_at_ms": nil, "features": features}
	if !stopped.IsZero() {
		row["stopped_at_ms"] = stopped.UnixMilli()
	}
	if err := f.db.Table(f.cfg.RelaysTableName()).Create(row).Error; err != nil {
		t.Fatalf("heartbeat of %s: %v", id, err)
	}
}

// store returns a gormstore.Store on the fixture's tables with count
// buckets (0: the fixture's), on the database's clock.
func (f *opsFixture) store(t *testing.T, count int) *gormstore.Store {
	t.Helper()
	cfg := f.cfg
	if count > 0 {
		cfg.BucketCount = count
	}
	s, err := gormstore.New(f.db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dbNow is the database's clock, read through the store.
func (f *opsFixture) dbNow(t *testing.T) time.Time {
	t.Helper()
	now, err := f.store(t, 0).Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// opsRun is how a test runs a subcommand.
type opsRun struct {
	// dbNow fixes the database's clock; zero means the real one.
	dbNow time.Time
	// hostNow is this host's clock; nil means time.Now.
	hostNow func() time.Time
	env     map[string]string
}

// run runs the subcommand args[0] with args[1:] and the fixture's database
// flags, as the binary runs it.
func (r opsRun) run(t *testing.T, f *opsFixture, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	e := &adminEnv{
		getenv: func(k string) string { return r.env[k] },
		stdout: &out, stderr: &errOut,
		open: openStoreAdmin, now: time.Now,
	}
	if r.hostNow != nil {
		e.now = r.hostNow
	}
	if !r.dbNow.IsZero() {
		e.dbNow = func(context.Context) (time.Time, error) { return r.dbNow, nil }
	}
	var flags []string
	if f != nil {
		flags = f.flags
	}
	code = runSubcommand(ctx, args[0], append(args[1:len(args):len(args)], flags...), e)
	t.Logf("outbox-relay %s → %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// fixed is an opsRun with both clocks at testNow.
func fixed() opsRun { return opsRun{dbNow: testNow, hostNow: func() time.Time { return testNow }} }

// statusFixture fills f (4 buckets) with the scenario of the status
// tests, around testNow: bucket 0 with two pending rows (12 s and 5 s old)
// leased to relay-a for 24 s more; bucket 1 empty, leased to relay-a;
// bucket 2 with a 6-minute-old pending row and a parked one, its lease to
// relay-b expired 3m05s ago; bucket 3 free; a row in bucket 9, outside the
// count. relay-a is live, relay-b silent, relay-c stopped an hour ago.
func statusFixture(t *testing.T, f *opsFixture) {
	t.Helper()
	at := func(d time.Duration) time.Time { return testNow.Add(d) }
	f.enqueue(t, 0, 0, "a", at(-12*time.Second))
	f.enqueue(t, 0, 4, "b", at(-5*time.Second))
	f.enqueue(t, 0, 2, "c", at(-6*time.Minute))
	f.park(t, f.enqueue(t, 0, 6, "d", at(-10*time.Minute)), at(-9*time.Minute))
	f.enqueue(t, 16, 9, "e", at(-time.Minute))
	f.lease(t, 0, "relay-a", at(24*time.Second))
	f.lease(t, 1, "relay-a", at(24*time.Second))
	f.lease(t, 2, "relay-b", at(-3*time.Minute-5*time.Second))
	f.lease(t, 3, "", time.Time{})
	f.heartbeat(t, "relay-a", at(-2*time.Second), time.Time{}, outbox.RelayFeatureParking)
	f.heartbeat(t, "relay-b", at(-3*time.Minute-10*time.Second), time.Time{}, outbox.RelayFeatureParking)
	f.heartbeat(t, "relay-c", at(-time.Hour), at(-time.Hour), outbox.RelayFeatureParking)
}

const statusGolden = `st_messages: 4 buckets, at 2025-03-01 12:00:00 UTC on the database's clock

BUCKET  PENDING  OLDEST  PARKED  OWNER    LEASE
0       2        12s     0       relay-a  expires in 24s
1       0        -       0       relay-a  expires in 24s
2       1        6m00s   1       relay-b  expired 3m05s ago
3       0        -       0       -        free
9       1        1m00s   0       -        outside -bucket-count 4

RELAY    STATE              LAST SEEN  BUCKETS
relay-a  live               2s ago     0-1 (2)
relay-b  silent             3m10s ago  -
relay-c  stopped 1h00m ago  1h00m ago  -

3 pending (oldest 6m00s, bucket 2), 1 parked; 2 of 4 buckets owned; relays: 1 live, 1 silent, 1 stopped
UNHEALTHY: st_messages holds 1 row in bucket 9, outside -bucket-count 4: writers and relays disagree, and relays stop with ErrMisconfigured (see outbox-relay check)
UNHEALTHY: buckets 2-3: no live owner (lease free or expired)
UNHEALTHY: bucket 2: pending rows older than -max-age 5m (oldest 6m00s, bucket 2)
`

// TestStatusShowsBucketsLeasesAndRelaysInHumanTime runs status on every
// database over the status scenario, with the clock fixed: the table is
// exactly the golden one, and the exit code 1 (unhealthy).
func TestStatusShowsBucketsLeasesAndRelaysInHumanTime(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "st", 4)
		statusFixture(t, f)
		code, stdout, stderr := fixed().run(t, f, "status")
		if code != exitFailure {
			t.Errorf("status exit code = %d; want %d (unhealthy)", code, exitFailure)
		}
		if stdout != statusGolden {
			t.Errorf("status printed\n%s\nwant\n%s", stdout, statusGolden)
		}
		if stderr != "" {
			t.Errorf("stderr = %q; want nothing", stderr)
		}
		if f.driver == "mysql" { // created_at as text: the same table
			f.db = testenv.MySQLWith(t, db, func(c *mysqldrv.Config) { c.ParseTime = false })
			_, dsn := dsnOf(t, f.db)
			f.flags[3] = dsn
			if _, stdout, _ := fixed().run(t, f, "status"); stdout != statusGolden {
				t.Errorf("status without parseTime printed\n%s\nwant\n%s", stdout, statusGolden)
			}
		}
	})
}

// TestStatusJSON runs status -json on every database over the status
// scenario and checks the object field by field.
func TestStatusJSON(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "sj", 4)
		statusFixture(t, f)
		code, stdout, _ := fixed().run(t, f, "status", "-json", "-max-age", "10m")
		if code != exitFailure {
			t.Errorf("status -json exit code = %d; want %d", code, exitFailure)
		}
		var rep statusReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("status -json is not one JSON object: %v\n%s", err, stdout)
		}
		if rep.Healthy || len(rep.Problems) != 2 { // -max-age 10m: no age problem
			t.Errorf("healthy = %v, problems = %q; want false and 2 (rows outside, unowned buckets)", rep.Healthy, rep.Problems)
		}
		if !rep.DatabaseTime.Equal(testNow) || rep.BucketCount != 4 || rep.MessagesTable != "sj_messages" || rep.MaxAgeSeconds != 600 || rep.LeaseDurationSeconds != 30 {
			t.Errorf("header = %+v", rep)
		}
		if len(rep.Buckets) != 4 {
			t.Fatalf("%d buckets; want 4", len(rep.Buckets))
		}
		want := []struct {
			pending, parked int64
			oldest          *int64
			lease, owner    string
			expiresIn       *int64
		}{
			{2, 0, ptr[int64](12), "held", "relay-a", ptr[int64](24)},
			{0, 0, nil, "held", "relay-a", ptr[int64](24)},
			{1, 1, ptr[int64](360), "expired", "relay-b", ptr[int64](-185)},
			{0, 0, nil, "free", "", nil},
		}
		for i, w := range want {
			b := rep.Buckets[i]
			if b.Bucket != i || b.Pending != w.pending || b.Parked != w.parked || !eqPtr(b.OldestAgeSeconds, w.oldest) ||
				b.Lease != w.lease || ptrValue(b.Owner) != w.owner || !eqPtr(b.LeaseExpiresInSeconds, w.expiresIn) {
				t.Errorf("bucket %d = %s; want %+v", i, jsonOf(b), w)
			}
		}
		if len(rep.Outside) != 1 || rep.Outside[0].Bucket != 9 || rep.Outside[0].Pending != 1 {
			t.Errorf("outside_buckets = %s; want bucket 9 with 1 pending row", jsonOf(rep.Outside))
		}
		states := map[string]string{}
		for _, r := range rep.Relays {
			states[r.ID] = r.State
		}
		if len(rep.Relays) != 3 || states["relay-a"] != "live" || states["relay-b"] != "silent" || states["relay-c"] != "stopped" {
			t.Errorf("relays = %s; want relay-a live, relay-b silent, relay-c stopped", jsonOf(rep.Relays))
		}
		if tot := rep.Totals; tot.Pending != 3 || tot.Parked != 1 || !eqPtr(tot.OldestAgeSeconds, ptr[int64](360)) || tot.BucketsOwned != 2 || tot.RelaysLive != 1 {
			t.Errorf("totals = %s", jsonOf(tot))
		}
	})
}

// TestStatusIsHealthyWhenEveryBucketHasALiveOwnerAndNoOldRow: exit 0, and
// -max-age decides whether an old row makes it unhealthy.
func TestStatusIsHealthyWhenEveryBucketHasALiveOwnerAndNoOldRow(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "sh", 2)
		f.enqueue(t, 0, 1, "k", testNow.Add(-2*time.Minute))
		f.lease(t, 0, "relay-a", testNow.Add(20*time.Second))
		f.lease(t, 1, "relay-b", testNow.Add(25*time.Second))
		f.heartbeat(t, "relay-a", testNow.Add(-time.Second), time.Time{}, 1)
		f.heartbeat(t, "relay-b", testNow.Add(-5*time.Second), time.Time{}, 1)
		code, stdout, _ := fixed().run(t, f, "status")
		if code != exitOK || !strings.Contains(stdout, "healthy: every bucket has a live owner, no pending row older than -max-age 5m\n") {
			t.Errorf("status = %d; want 0 and the healthy line", code)
		}
		if code, stdout, _ := fixed().run(t, f, "status", "-max-age", "90s"); code != exitFailure ||
			!strings.Contains(stdout, "UNHEALTHY: bucket 1: pending rows older than -max-age 1m30s (oldest 2m00s, bucket 1)") {
			t.Errorf("status -max-age 90s = %d; want 1 and the age problem", code)
		}
		if code, _, _ := fixed().run(t, f, "status", "-max-age", "0"); code != exitOK {
			t.Errorf("status -max-age 0 = %d; want 0 (no age check)", code)
		}
	})
}

// TestStatusReportsLeasesOutsideItsBucketCount: a relay at 8 buckets holds
// leases 0-7; status -bucket-count 4 is unhealthy (exit 1), naming the lease
// rows outside its count and their holder, as check does; at 8 it is
// healthy.
func TestStatusReportsLeasesOutsideItsBucketCount(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "so", 8)
		for b := range 8 {
			f.lease(t, b, "relay-a", testNow.Add(20*time.Second))
		}
		f.heartbeat(t, "relay-a", testNow.Add(-time.Second), time.Time{}, 1)
		if code, _, _ := fixed().run(t, f, "status"); code != exitOK {
			t.Errorf("status -bucket-count 8 = %d; want 0", code)
		}
		f.flags[5] = "4" // -bucket-count
		code, stdout, _ := fixed().run(t, f, "status")
		want := "so_leases has lease rows for buckets 4-7, outside -bucket-count 4, held by relay-a"
		if code != exitFailure || !strings.Contains(stdout, want) {
			t.Errorf("status -bucket-count 4 = %d; want 1 and %q", code, want)
		}
		code, stdout, _ = fixed().run(t, f, "status", "-json")
		var rep statusReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != exitFailure || rep.Healthy || len(rep.Outside) != 4 ||
			rep.Outside[0].Bucket != 4 || rep.Outside[0].Lease != "held" {
			t.Errorf("status -json -bucket-count 4 = %d, %v; want unhealthy with buckets 4-7 outside, held", code, err)
		}
	})
}

// TestStatusComparesLeasesWithTheDatabaseClock: with this host's clock an
// hour ahead of the database's, status still reports the lease as held
// for its remaining time on the database's clock, and says how far the
// host's clock is off.
func TestStatusComparesLeasesWithTheDatabaseClock(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		f := newOpsFixture(t, db, "sc", 1)
		now := f.dbNow(t)
		f.lease(t, 0, "relay-a", now.Add(90*time.Second))
		f.heartbeat(t, "relay-a", now, time.Time{}, 1)
		skewed := opsRun{hostNow: func() time.Time { return time.Now().Add(time.Hour) }}
		code, stdout, _ := skewed.run(t, f, "status", "-json")
		var rep statusReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("status -json: %v\n%s", err, stdout)
		}
		if b := rep.Buckets[0]; code != exitOK || b.Lease != "held" || b.LeaseExpiresInSeconds == nil || *b.LeaseExpiresInSeconds < 60 || *b.LeaseExpiresInSeconds > 90 {
			t.Errorf("status with the host an hour ahead = %d, bucket 0 %s; want 0 and the lease held for 60-90 s more", code, jsonOf(b))
		}
		if rep.HostAheadSeconds < 3590 || rep.HostAheadSeconds > 3610 {
			t.Errorf("host_ahead_seconds = %v; want about 3600", rep.HostAheadSeconds)
		}
		_, stdout, _ = skewed.run(t, f, "status")
		if !strings.Contains(stdout, "(this host's clock is 1h ahead of it; every time below is on the database's)") {
			t.Errorf("status does not say the host's clock is an hour ahead:\n%s", stdout)
		}
	})
}

// TestStatusListsOnlyNotableBucketsOfALargeCount: above 64 buckets the
// table lists the buckets with rows or without a live owner, and says how
// many it left out; -all-buckets and -json list them all.
func TestStatusListsOnlyNotableBucketsOfALargeCount(t *testing.T) {
	cfg := outbox.Config{BucketCount: 100}.WithDefaults()
	var leases []leaseRow
	for b := range 100 {
		if b != 42 {
			leases = append(leases, leaseRow{Bucket: int32(b), Owner: ptr("relay-a"), ExpiresAtMs: testNow.Add(20 * time.Second).UnixMilli()})
		}
	}
	rows := []bucketRows{{Bucket: 7, Pending: 3, Oldest: testNow.Add(-time.Second)}}
	relays := []relayRow{{RelayID: "relay-a", LastSeenMs: testNow.UnixMilli(), Features: 1}}
	rep := buildStatus(cfg, dbClock{now: testNow}, 30*time.Second, 5*time.Minute, rows, leases, relays)
	var out bytes.Buffer
	if err := writeStatus(&out, rep, dbClock{now: testNow}, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"\n7       3        1s      0       relay-a  expires in 20s\n", "\n42      0        -       0       -        free\n",
		"(98 other buckets not listed: no rows, owned; -all-buckets lists them)", "relay-a  live   0s ago     0-41, 43-99 (99)",
		"UNHEALTHY: bucket 42: no live owner (lease free or expired)"} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q:\n%s", want, got)
		}
	}
	out.Reset()
	if err := writeStatus(&out, rep, dbClock{now: testNow}, true); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "expires in 20s\n"); n != 99 {
		t.Errorf("-all-buckets lists %d owned buckets; want 99", n)
	}
}

// TestStatusOnAnUnreachableDatabaseExitsOneWithOneLine: a runtime failure
// is one line on stderr, nothing on stdout (so -json output is never
// half-written), exit 1.
func TestStatusOnAnUnreachableDatabaseExitsOneWithOneLine(t *testing.T) {
	for _, cmd := range [][]string{{"status"}, {"status", "-json"}, {"check"}, {"rebucket", "-to", "4"}} {
		dsn := "file:" + filepath.Join(t.TempDir(), "no", "such", "dir", "outbox.db") + "?mode=rw"
		code, stdout, stderr := opsRun{}.run(t, nil, append(cmd, "-db-driver", "sqlite", "-db-dsn", dsn)...)
		if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "database unreachable") {
			t.Errorf("%v on an unreachable database = %d, stdout %q, stderr %q; want 1, nothing, one line saying so", cmd, code, stdout, stderr)
		}
	}
}

// TestReadOnlyCommandsCreateNoDatabaseFile: status, check and parked on a
// SQLite path that does not exist (a typo) fail with one line, exit 1, and
// leave no file behind: they open the database read-only.
func TestReadOnlyCommandsCreateNoDatabaseFile(t *testing.T) {
	for _, cmd := range [][]string{{"status"}, {"check"}, {"parked"}, {"parked", "-json"}} {
		for _, dsn := range []string{"typo.db", "typo.db?_busy_timeout=1000", "file:typo.db?_busy_timeout=1000"} {
			dir := t.TempDir()
			path := filepath.Join(dir, "typo.db")
			dsn = strings.Replace(dsn, "typo.db", path, 1)
			code, stdout, stderr := opsRun{}.run(t, nil, append(cmd, "-db-driver", "sqlite", "-db-dsn", dsn)...)
			if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%v -db-dsn %s = %d, stdout %q, stderr %q; want 1, nothing, one line", cmd, dsn, code, stdout, stderr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("%v -db-dsn %s left %d file(s) behind (%s, …)", cmd, dsn, len(entries), entries[0].Name())
			}
		}
	}
	// A plain path becomes a URI filename ('%' and '#' escaped; like the
	// driver, the first '?' starts the parameters). The other status,
	// check and parked tests read existing databases through it.
	if got := sqliteReadOnly("/data/a b%#.db?_txlock=immediate"); got != "file:/data/a b%25%23.db?_txlock=immediate&mode=ro" {
		t.Errorf("sqliteReadOnly = %q", got)
	}
}

// TestOpsUsageErrorsExitTwoNamingTheFlag: bad flags of status, check and
// rebucket are one line naming the flag, exit 2, before any connection;
// their action flags are never read from the environment, -lease-duration
// is.
func TestOpsUsageErrorsExitTwoNamingTheFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"rebucket_without_to", withDB("rebucket", "-confirm"), nil, "-to is required"},
		{"rebucket_to_zero", withDB("rebucket", "-to", "0"), nil, "-to 0: must be between 1 and 65536"},
		{"rebucket_to_too_large", withDB("rebucket", "-to", "65537"), nil, "-to 65537: must be between 1 and 65536"},
		{"rebucket_to_from_environment", withDB("rebucket", "-confirm"), map[string]string{"OUTBOX_TO": "4"}, "-to is required"},
		{"status_negative_max_age", withDB("status", "-max-age", "-1m"), nil, `-max-age "-1m0s": must not be negative`},
		{"status_max_age_without_unit", withDB("status", "-max-age", "300"), nil, `-max-age "300": a duration needs a unit`},
		{"status_confirm", withDB("status", "-confirm"), nil, "-confirm: not a flag of outbox-relay status"},
		{"check_kafka_flag", withDB("check", "-kafka-brokers", "a:1"), nil, "-kafka-brokers: not a flag of outbox-relay check"},
		{"zero_lease_duration", withDB("check", "-lease-duration", "0s"), nil, `-lease-duration "0s": must be positive`},
		{"lease_duration_from_environment", withDB("status"), map[string]string{"OUTBOX_LEASE_DURATION": "soon"}, `OUTBOX_LEASE_DURATION="soon"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := opsRun{env: tc.env}.run(t, nil, tc.args...)
			prefix := "outbox-relay " + tc.args[0] + ": "
			if code != exitConfig || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, prefix) || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v = %d, stdout %q, stderr %q; want 2 and one line %q… containing %q", tc.args, code, stdout, stderr, prefix, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func ptrValue(s *string) string { return *cmp.Or(s, new(string)) }

func eqPtr[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// docBlock returns the text of docs/operating.md's code block that starts
// with the line first, up to its closing fence.
func docBlock(t *testing.T, first string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "```\n"+first+"\n")
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatalf("docs/operating.md has no code block starting with %q", first)
	}
	return block
}

// TestDocumentedStatusSampleIsWhatStatusPrints: docs/operating.md's sample of
// outbox-relay status is the command's output over the situation it
// describes (a relay stopped answering 34 s ago; its bucket's lease expired
// 4 s ago), on every database.
func TestDocumentedStatusSampleIsWhatStatusPrints(t *testing.T) {
	want := docBlock(t, "$ outbox-relay status")
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		cfg := outbox.Config{}
		if err := outbox.AutoMigrate(db, cfg); err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("DELETE FROM " + cfg.LeasesTableName()).Error; err != nil {
			t.Fatal(err)
		}
		driver, dsn := dsnOf(t, db)
		f := &opsFixture{db: db, cfg: cfg.WithDefaults(), driver: driver, flags: []string{"-db-driver", driver, "-db-dsn", dsn}}
		at := func(d time.Duration) time.Time { return testNow.Add(d) }
		for i := range 12 {
			f.enqueue(t, 0, 0, "order-1", at(-time.Second-time.Duration(i)*time.Millisecond))
		}
		for range 3 {
			f.enqueue(t, 0, 2, "order-9", at(-2*time.Second))
		}
		f.park(t, f.enqueue(t, 0, 5, "order-17", at(-2*time.Hour-13*time.Minute)), at(-2*time.Hour-10*time.Minute))
		for range 36 {
			f.enqueue(t, 0, 7, "order-4", at(-35*time.Second))
		}
		for b := range 8 {
			switch {
			case b < 4:
				f.lease(t, b, "relay-a1f3", at(27*time.Second))
			case b < 7:
				f.lease(t, b, "relay-b07e", at(24*time.Second))
			default:
				f.lease(t, b, "relay-c9d2", at(-4*time.Second))
			}
		}
		f.heartbeat(t, "relay-a1f3", at(-3*time.Second), time.Time{}, 1)
		f.heartbeat(t, "relay-b07e", at(-6*time.Second), time.Time{}, 1)
		f.heartbeat(t, "relay-c9d2", at(-34*time.Second), time.Time{}, 1)
		code, stdout, _ := fixed().run(t, f, "status")
		if code != exitFailure || stdout != want {
			t.Errorf("status = %d\n%s\nthe README shows (exit 1)\n%s", code, stdout, want)
		}
	})
}
