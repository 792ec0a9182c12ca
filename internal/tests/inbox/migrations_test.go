package inbox_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/migrations"
)

// describeTable returns a normalised description of table, as the outbox's
// schema test does: columns (type, nullability, primary key, length,
// auto-increment, default) and indexes (name, columns in order,
// uniqueness).
func describeTable(t *testing.T, db *gorm.DB, table string) []string {
	t.Helper()
	m := db.Migrator()
	if !m.HasTable(table) {
		return []string{table + ": missing"}
	}
	cols, err := m.ColumnTypes(table)
	if err != nil {
		t.Fatalf("ColumnTypes(%s): %v", table, err)
	}
	var out []string
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
		if primary, _ := i.PrimaryKey(); primary {
			continue // reported per column
		}
		out = append(out, fmt.Sprintf("%s index %s on %v unique=%v", table, i.Name(), i.Columns(), unique))
	}
	sort.Strings(out)
	return out
}

// TestInboxMigrationsMatchAutoMigrate: on every database,
// migrations/inbox/<dialect>.sql creates exactly the table
// inbox.AutoMigrate creates, and AutoMigrate over it changes nothing.
func TestInboxMigrationsMatchAutoMigrate(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			auto := o.Open(t, nil)
			if err := inbox.AutoMigrate(auto, inbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate: %v", err)
			}
			rec := &testenv.SQLRecorder{}
			hand := o.Open(t, &gorm.Config{Logger: rec})
			stmts, err := migrations.InboxStatements(o.Name)
			if err != nil {
				t.Fatal(err)
			}
			if len(stmts) == 0 {
				t.Fatalf("InboxStatements(%s) is empty", o.Name)
			}
			for _, s := range stmts {
				if err := hand.Exec(s).Error; err != nil {
					t.Fatalf("migrations/inbox/%s.sql: %v\n%s", o.Name, err, s)
				}
			}
			got, want := describeTable(t, hand, inbox.DefaultTable), describeTable(t, auto, inbox.DefaultTable)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("migrations/inbox/%s.sql differs from AutoMigrate:\n--- migrations\n%s\n--- AutoMigrate\n%s",
					o.Name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			rec.Reset()
			if err := inbox.AutoMigrate(hand, inbox.Config{}); err != nil {
				t.Fatalf("AutoMigrate over migrations/inbox/%s.sql: %v", o.Name, err)
			}
			if ddl := rec.DDL(); len(ddl) != 0 {
				t.Fatalf("AutoMigrate over migrations/inbox/%s.sql changed the schema:\n%s", o.Name, strings.Join(ddl, "\n"))
			}
		})
	}
}

// TestAutoMigrateCustomTable: a configured table name (and, on PostgreSQL
// and MySQL, schema) gets the same columns and its own index name; an
// invalid name is refused before any DDL.
func TestAutoMigrateCustomTable(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := inbox.Config{Table: "seen_events"}
			qualified := "seen_events"
			switch o.Name {
			case testenv.Postgres:
				testenv.MustExec(t, db, "CREATE SCHEMA consumer")
				cfg.Schema, qualified = "consumer", "consumer.seen_events"
			case testenv.MySQL:
				var name string
				if err := db.Raw("SELECT DATABASE()").Scan(&name).Error; err != nil {
					t.Fatal(err)
				}
				cfg.Schema, qualified = name, name+".seen_events"
			}
			if err := inbox.AutoMigrate(db, cfg); err != nil {
				t.Fatalf("AutoMigrate(%+v): %v", cfg, err)
			}
			if cfg.TableName() != qualified {
				t.Fatalf("TableName() = %q; want %q", cfg.TableName(), qualified)
			}
			described := qualified
			if o.Name == testenv.MySQL {
				described = cfg.Table // gorm's MySQL migrator describes tables of the current database by name
			}
			got := strings.Join(describeTable(t, db, described), "\n")
			for _, want := range []string{".handler_name ", ".message_id ", ".processed_at_ms ", "index idx_seen_events_processed_at_ms on [processed_at_ms]"} {
				if !strings.Contains(got, want) {
					t.Errorf("table %s lacks %q:\n%s", qualified, want, got)
				}
			}
			ib, err := inbox.New(db, inbox.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := withTimeout(t, time.Minute)
			for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
				if out, err := ib.Handle(ctx, "h", record("orders", 0, 1, "id-1"), func(*gorm.DB) error { return nil }); err != nil || out != want {
					t.Fatalf("Handle on %s = %v, %v; want %v", qualified, out, err, want)
				}
			}
			for _, bad := range []inbox.Config{{Table: "x; DROP TABLE y"}, {Schema: "1a", Table: "t"}} {
				if err := inbox.AutoMigrate(db, bad); err == nil {
					t.Errorf("AutoMigrate(%+v) = nil; want an error", bad)
				}
			}
		})
	}
	if _, err := migrations.InboxSQL("oracle"); err == nil {
		t.Error(`InboxSQL("oracle") = nil error; want one`)
	}
}
