package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/migrations"
)

// TestCheckFindsEachProblem sets up, on every database, one outbox per
// problem check detects (and one without any), runs check on each, and
// requires exactly the expected problems, one line each, with the words
// that explain them; exit 1 when there is one, 0 and "ok: …" otherwise.
func TestCheckFindsEachProblem(t *testing.T) {
	ctx := context.Background()
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	acquire := func(t *testing.T, f *opsFixture, count int, relayID string) {
		t.Helper()
		if _, err := f.store(t, count).AcquireBucketLeases(ctx, relayID, count, 30*time.Second); err != nil {
			t.Fatalf("AcquireBucketLeases(%s, %d): %v", relayID, count, err)
		}
	}
	freeLeases := func(t *testing.T, f *opsFixture, buckets ...int) {
		for _, b := range buckets {
			f.lease(t, b, "", time.Time{})
		}
	}
	exec := func(t *testing.T, db *gorm.DB, stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			if err := db.Exec(s).Error; err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	type scenario struct {
		name string
		// setup prepares f, an outbox of 8 buckets.
		setup func(t *testing.T, f *opsFixture)
		// fixed: run check with the clock at testNow.
		fixed bool
		// want are the problems' checks (sorted) and words each line has.
		want  []string
		words []string
	}
	scenarios := []scenario{
		{name: "consistent", setup: func(t *testing.T, f *opsFixture) {
			acquire(t, f, 8, "relay-1")
			f.enqueueKeys(t, 8, keys...)
		}, words: []string{"ok: ck_consistent_messages, ck_consistent_leases and ck_consistent_relays have their columns and indexes",
			"the newest 40 rows hash to theirs", "the lease rows match the 8 buckets; 1 relay is live, with parking support"}},
		{name: "rows_outside", setup: func(t *testing.T, f *opsFixture) {
			f.enqueue(t, 16, 9, "k", testNow)
			f.enqueue(t, 16, 12, "k", testNow)
		}, want: []string{checkRowsOutside}, words: []string{"holds 2 rows in buckets 9, 12, outside -bucket-count 8", "larger outbox.Config.BucketCount"}},
		{name: "writers_with_5", setup: func(t *testing.T, f *opsFixture) {
			f.enqueueKeys(t, 5, keys...)
		}, want: []string{checkRowsMisplaced}, words: []string{"of the newest 40 rows", "are not in the bucket -bucket-count 8 gives their key", "a count of 5 fits each of them"}},
		{name: "relay_with_16", setup: func(t *testing.T, f *opsFixture) {
			acquire(t, f, 16, "big")
		}, want: []string{checkLeasesOutside}, words: []string{"relay big holds a lease on buckets 8-15, outside -bucket-count 8: it runs with a larger bucket count (at least 16)"}},
		{name: "leftover_leases", setup: func(t *testing.T, f *opsFixture) {
			freeLeases(t, f, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
		}, want: []string{checkLeasesOutside}, words: []string{"ck_leftover_leases_leases has rows for buckets 8-11, outside -bucket-count 8", "rebucket -to 8"}},
		{name: "relay_with_4", setup: func(t *testing.T, f *opsFixture) {
			acquire(t, f, 4, "small")
		}, want: []string{checkLeasesMissing}, words: []string{"has no row for buckets 4-7 although 1 relay is live (small): they run with a smaller bucket count (probably 4)"}},
		{name: "old_relay", fixed: true, setup: func(t *testing.T, f *opsFixture) {
			freeLeases(t, f, 0, 1, 2, 3, 4, 5, 6, 7)
			f.heartbeat(t, "old", testNow.Add(-time.Second), time.Time{}, 0)
		}, want: []string{checkRelayParking}, words: []string{"relay old is live without parking support (features 0)"}},
		{name: "long_lease", fixed: true, setup: func(t *testing.T, f *opsFixture) {
			for b := range 8 {
				f.lease(t, b, "slow", testNow.Add(58*time.Second))
			}
			f.heartbeat(t, "slow", testNow.Add(-2*time.Second), time.Time{}, 1)
		}, want: []string{checkRelayLeaseLonger}, words: []string{"relay slow holds leases that expire 1m after its last heartbeat, more than -lease-duration 30s", "(at least 1m)"}},
		{name: "missing_table", setup: func(t *testing.T, f *opsFixture) {
			exec(t, f.db, "DROP TABLE ck_missing_table_relays")
		}, want: []string{checkMissingTable}, words: []string{"missing table ck_missing_table_relays: start a relay once with -migrate, or apply migrations/"}},
		{name: "missing_indexes", setup: func(t *testing.T, f *opsFixture) {
			drop := "DROP INDEX idx_ck_missing_indexes_messages_bucket_parked_id"
			if f.driver == "mysql" {
				drop += " ON ck_missing_indexes_messages"
			}
			exec(t, f.db, drop, "DROP TABLE ck_missing_indexes_leases",
				"CREATE TABLE ck_missing_indexes_leases (bucket integer NOT NULL, owner varchar(128), expires_at_ms bigint NOT NULL)")
		}, want: []string{checkMissingIndex, checkMissingIndex}, words: []string{"has no index on (bucket, parked_at_ms, id), the relay's read path", "ck_missing_indexes_leases has no primary key or unique index on (bucket)"}},
	}
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) {
				f := newOpsFixture(t, db, "ck_"+sc.name, 8)
				sc.setup(t, f)
				r := opsRun{}
				if sc.fixed {
					r = fixed()
				}
				code, stdout, stderr := r.run(t, f, "check")
				lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
				if len(sc.want) == 0 {
					if code != exitOK || len(lines) != 1 || !strings.HasPrefix(stdout, "ok: ") || stderr != "" {
						t.Errorf("check = %d, stdout %q, stderr %q; want 0 and one ok line", code, stdout, stderr)
					}
				} else if code != exitFailure || len(lines) != len(sc.want) || stderr != fmt.Sprintf("outbox-relay check: %s\n", plural(int64(len(sc.want)), "problem")) {
					t.Errorf("check = %d, %d lines, stderr %q; want 1 and %d problem lines", code, len(lines), stderr, len(sc.want))
				}
				for _, w := range sc.words {
					if !strings.Contains(stdout, w) {
						t.Errorf("check output lacks %q:\n%s", w, stdout)
					}
				}
				_, stdout, _ = r.run(t, f, "check", "-json")
				var rep checkReport
				if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
					t.Fatalf("check -json: %v\n%s", err, stdout)
				}
				var got []string
				for _, p := range rep.Problems {
					got = append(got, p.Check)
				}
				slices.Sort(got)
				if rep.OK != (len(sc.want) == 0) || !slices.Equal(got, sc.want) {
					t.Errorf("check -json: ok %v, problems %v; want %v", rep.OK, got, sc.want)
				}
			})
		}
	})
}

// TestCheckNamesTheMissingColumnsOfSchemaVersionOne: on tables at version
// 1 (migrations' 000001_init), check names the three columns version 2
// added and the step that adds them.
func TestCheckNamesTheMissingColumnsOfSchemaVersionOne(t *testing.T) {
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		steps, err := migrations.Steps(db.Dialector.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range steps[0].Up {
			if err := db.Exec(s).Error; err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		driver, dsn := dsnOf(t, db)
		f := &opsFixture{db: db, driver: driver, flags: []string{"-db-driver", driver, "-db-dsn", dsn}}
		code, stdout, _ := opsRun{}.run(t, f, "check")
		want := []string{
			"outbox_messages lacks columns parked_at_ms, parked_reason: schema version 1: apply migrations/" + driver + "/000002_parking.up.sql, or start a relay once with -migrate",
			"outbox_relays lacks column features: schema version 1: apply migrations/" + driver + "/000002_parking.up.sql, or start a relay once with -migrate",
		}
		if code != exitFailure || stdout != strings.Join(want, "\n")+"\n" {
			t.Errorf("check on schema version 1 = %d\n%s\nwant 1 and\n%s", code, stdout, strings.Join(want, "\n"))
		}
	})
}
