package outbox_test

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/migrations"
	"gorm.io/gorm"
)

// describeSchema returns a normalised description of the outbox tables:
// columns (type, nullability, primary key, length, auto-increment, default)
// and indexes (name, columns in order, uniqueness).
func describeSchema(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var out []string
	m := db.Migrator()
	for _, table := range []string{outbox.DefaultMessagesTable, outbox.DefaultLeasesTable, outbox.DefaultRelaysTable} {
		if !m.HasTable(table) {
			out = append(out, table+": missing")
			continue
		}
		cols, err := m.ColumnTypes(table)
		if err != nil {
			t.Fatalf("ColumnTypes(%s): %v", table, err)
		}
		for _, c := range cols {
			nullable, _ := c.Nullable()
			pk, _ := c.PrimaryKey()
			length, _ := c.Length()
			auto, _ := c.AutoIncrement()
			def, _ := c.DefaultValue()
			out = append(out, fmt.Sprintf("%s.%s type=%s null=%v pk=%v len=%d auto=%v default=%q",
				table, c.Name(), strings.ToLower(c.DatabaseTypeName()), nullable, pk, length, auto, def))
		}
		idx, err := m.GetIndexes(table)
		if err != nil {
			t.Fatalf("GetIndexes(%s): %v", table, err)
		}
		for _, i := range idx {
			unique, _ := i.Unique()
			primary, _ := i.PrimaryKey()
			if primary {
				continue // reported per column
			}
			out = append(out, fmt.Sprintf("%s index %s on %v unique=%v", table, i.Name(), i.Columns(), unique))
		}
		if db.Dialector.Name() == "postgres" {
			var opts string
			if err := db.Raw("SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = to_regclass(?)", table).Scan(&opts).Error; err != nil {
				t.Fatalf("storage parameters of %s: %v", table, err)
			}
			out = append(out, fmt.Sprintf("%s storage parameters %q", table, opts))
		}
	}
	sort.Strings(out)
	return out
}

// applyStatements runs stmts on db, failing t with what names the file.
func applyStatements(t *testing.T, db *gorm.DB, what string, stmts []string) {
	t.Helper()
	for _, st := range stmts {
		if err := db.Exec(st).Error; err != nil {
			t.Fatalf("%s: %v\n%s", what, err, st)
		}
	}
}

// sameSchema fails t when got and want differ.
func sameSchema(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s differs from AutoMigrate:\n--- %s\n%s\n--- AutoMigrate\n%s",
			what, what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// autoMigrateChangesNothing fails t when outbox.AutoMigrate over db's
// schema runs any DDL.
func autoMigrateChangesNothing(t *testing.T, db *gorm.DB, rec *testenv.SQLRecorder, what string) {
	t.Helper()
	rec.Reset()
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatalf("AutoMigrate over %s: %v", what, err)
	}
	if ddl := rec.DDL(); len(ddl) != 0 {
		t.Fatalf("AutoMigrate over %s changed the schema:\n%s", what, strings.Join(ddl, "\n"))
	}
}

func TestMigrationsMatchAutoMigrate(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			auto := o.Open(t, nil)
			if err := outbox.AutoMigrate(auto, outbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate: %v", err)
			}
			rec := &testenv.SQLRecorder{}
			hand := o.Open(t, &gorm.Config{Logger: rec})
			stmts, err := migrations.Statements(o.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range stmts {
				if err := hand.Exec(s).Error; err != nil {
					t.Fatalf("migrations/%s.sql: %v\n%s", o.Name, err, s)
				}
			}
			got, want := describeSchema(t, hand), describeSchema(t, auto)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("migrations/%s.sql schema differs from AutoMigrate:\n--- migrations\n%s\n--- AutoMigrate\n%s",
					o.Name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// AutoMigrate over the hand-written schema must find nothing to change.
			rec.Reset()
			if err := outbox.AutoMigrate(hand, outbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate over migrations/%s.sql: %v", o.Name, err)
			}
			if ddl := rec.DDL(); len(ddl) != 0 {
				t.Fatalf("AutoMigrate over migrations/%s.sql changed the schema:\n%s", o.Name, strings.Join(ddl, "\n"))
			}
		})
	}
}

// TestVersionedMigrationsMatchAutoMigrate: on every database, the versioned
// steps 000001 + 000002 give exactly the full DDL (which equals a fresh
// AutoMigrate); outbox.AutoMigrate run over the version 1 schema upgrades
// it to the same schema (the new index present, the replaced one dropped);
// and 000002's down step returns to version 1.
func TestVersionedMigrationsMatchAutoMigrate(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			steps, err := migrations.Steps(o.Name)
			if err != nil {
				t.Fatal(err)
			}
			nSteps := 2 // 000003_lease_fillfactor is PostgreSQL's only
			if o.Name == "postgres" {
				nSteps = 3
			}
			if len(steps) != nSteps || steps[0].Version != 1 || steps[1].Version != 2 || steps[1].Name != "parking" ||
				(nSteps == 3 && (steps[2].Version != 3 || steps[2].Name != "lease_fillfactor")) {
				t.Fatalf("Steps(%s) = %d steps; want 000001_init, 000002_parking and, on PostgreSQL only, 000003_lease_fillfactor", o.Name, len(steps))
			}
			fsys, err := migrations.Versioned(o.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"000001_init.up.sql", "000001_init.down.sql", "000002_parking.up.sql", "000002_parking.down.sql"} {
				if _, err := fs.Stat(fsys, f); err != nil {
					t.Errorf("Versioned(%s) lacks %s: %v", o.Name, f, err)
				}
			}
			fresh := o.Open(t, nil)
			if err := outbox.AutoMigrate(fresh, outbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate: %v", err)
			}
			want := describeSchema(t, fresh)

			// (b) 000001 + 000002 applied.
			rec := &testenv.SQLRecorder{}
			stepped := o.Open(t, &gorm.Config{Logger: rec})
			applyStatements(t, stepped, "000001_init.up.sql", steps[0].Up)
			v1 := describeSchema(t, stepped)
			applyStatements(t, stepped, "000002_parking.up.sql", steps[1].Up)
			v2 := describeSchema(t, stepped)
			for _, st := range steps[2:] {
				applyStatements(t, stepped, fmt.Sprintf("%06d_%s.up.sql", st.Version, st.Name), st.Up)
			}
			sameSchema(t, "migrations/"+o.Name+"/every step", describeSchema(t, stepped), want)
			autoMigrateChangesNothing(t, stepped, rec, "every step")

			// Down: back to version 2, then 1 (no parked row), then up again.
			for i := len(steps) - 1; i >= 2; i-- {
				applyStatements(t, stepped, fmt.Sprintf("%06d_%s.down.sql", steps[i].Version, steps[i].Name), steps[i].Down)
			}
			sameSchema(t, "migrations/"+o.Name+" after the down steps to version 2", describeSchema(t, stepped), v2)
			applyStatements(t, stepped, "000002_parking.down.sql", steps[1].Down)
			if got := describeSchema(t, stepped); strings.Join(got, "\n") != strings.Join(v1, "\n") {
				t.Fatalf("000002 down did not return to version 1:\n--- after down\n%s\n--- version 1\n%s", strings.Join(got, "\n"), strings.Join(v1, "\n"))
			}

			// (c) AutoMigrate over the version 1 schema, with rows in it.
			recU := &testenv.SQLRecorder{}
			upgraded := o.Open(t, &gorm.Config{Logger: recU})
			applyStatements(t, upgraded, "000001_init.up.sql", steps[0].Up)
			if err := upgraded.Exec("INSERT INTO outbox_relays (relay_id, last_seen_ms) VALUES ('old-relay', 1)").Error; err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(upgraded, outbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate over version 1: %v", err)
			}
			got := describeSchema(t, upgraded)
			sameSchema(t, "AutoMigrate over migrations/"+o.Name+"/000001", got, want)
			if !slices.ContainsFunc(got, func(l string) bool { return strings.Contains(l, "idx_outbox_messages_bucket_parked_id") }) ||
				slices.ContainsFunc(got, func(l string) bool { return strings.Contains(l, "idx_outbox_messages_bucket_id ") }) {
				t.Fatalf("upgraded schema:\n%s\nwant idx_outbox_messages_bucket_parked_id and not idx_outbox_messages_bucket_id", strings.Join(got, "\n"))
			}
			var features int64
			if err := upgraded.Raw("SELECT features FROM outbox_relays WHERE relay_id = 'old-relay'").Scan(&features).Error; err != nil || features != 0 {
				t.Fatalf("features of a version 1 heartbeat row after the upgrade = %d, %v; want 0", features, err)
			}
			autoMigrateChangesNothing(t, upgraded, recU, "the upgraded version 1 schema")
		})
	}
}

// TestAutoMigrateDropsTheReplacedIndexOfCustomTables: the upgrade of a
// version 1 schema with configured table names drops that table's own
// (bucket, id) index and creates its (bucket, parked_at_ms, id) index.
func TestAutoMigrateDropsTheReplacedIndexOfCustomTables(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{MessagesTable: "billing_messages", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}
			steps, err := migrations.Steps(o.Name)
			if err != nil {
				t.Fatal(err)
			}
			r := strings.NewReplacer("outbox_messages", cfg.MessagesTable, "outbox_leases", cfg.LeasesTable, "outbox_relays", cfg.RelaysTable)
			for _, st := range steps[0].Up {
				if err := db.Exec(r.Replace(st)).Error; err != nil {
					t.Fatalf("%v\n%s", err, st)
				}
			}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			m := db.Migrator()
			if m.HasIndex(cfg.MessagesTable, "idx_billing_messages_bucket_id") {
				t.Error("idx_billing_messages_bucket_id survived the upgrade")
			}
			if !m.HasIndex(cfg.MessagesTable, "idx_billing_messages_bucket_parked_id") {
				t.Error("idx_billing_messages_bucket_parked_id missing after the upgrade")
			}
			if !m.HasColumn(cfg.RelaysTable, "features") || !m.HasColumn(cfg.MessagesTable, "parked_at_ms") || !m.HasColumn(cfg.MessagesTable, "parked_reason") {
				t.Error("a parking column is missing after the upgrade")
			}
		})
	}
}

// TestAutoMigrateSeedsTheFleetsBucketCount: AutoMigrate seeds the lease
// rows 0…N−1 of its Config into an empty lease table, once; the fleet's
// count is then the table's: a Config with another count is refused by
// AutoMigrate and CheckBucketCount with an error wrapping ErrMisconfigured
// that names both counts, and changes nothing.
func TestAutoMigrateSeedsTheFleetsBucketCount(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			p := testenv.Unique("s")
			cfg := outbox.Config{BucketCount: 16, MessagesTable: p + "_messages", LeasesTable: p + "_leases", RelaysTable: p + "_relays"}
			ctx := t.Context()
			if n, err := outbox.FleetBucketCount(ctx, db, cfg); err == nil {
				t.Fatalf("FleetBucketCount before the tables exist = %d, nil; want an error", n)
			}
			for range 2 {
				if err := outbox.AutoMigrate(db, cfg); err != nil {
					t.Fatalf("AutoMigrate: %v", err)
				}
			}
			var buckets []int
			if err := db.Table(cfg.LeasesTableName()).Order("bucket").Pluck("bucket", &buckets).Error; err != nil || len(buckets) != 16 || buckets[15] != 15 {
				t.Fatalf("lease rows after AutoMigrate twice = %v, %v; want 0…15", buckets, err)
			}
			if n, err := outbox.FleetBucketCount(ctx, db, cfg); err != nil || n != 16 {
				t.Fatalf("FleetBucketCount = %d, %v; want 16", n, err)
			}
			if err := outbox.CheckBucketCount(ctx, db, cfg); err != nil {
				t.Fatalf("CheckBucketCount(16) = %v; want nil", err)
			}
			other := cfg
			other.BucketCount = 0 // the default, 8
			for name, err := range map[string]error{"AutoMigrate": outbox.AutoMigrate(db, other), "CheckBucketCount": outbox.CheckBucketCount(ctx, db, other)} {
				if !errors.Is(err, outbox.ErrMisconfigured) || !strings.Contains(err.Error(), "16") || !strings.Contains(err.Error(), "8") {
					t.Errorf("%s with 8 buckets on a table of 16 = %v; want an error wrapping ErrMisconfigured naming 16 and 8", name, err)
				}
			}
			if n, err := outbox.FleetBucketCount(ctx, db, cfg); err != nil || n != 16 {
				t.Fatalf("FleetBucketCount after the refusals = %d, %v; want 16 (unchanged)", n, err)
			}
		})
	}
}
