package outbox_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/migrations"
	"gorm.io/gorm"
)

// describeSchema returns a normalised description of the outbox tables:
// columns (type, nullability, primary key, length) and indexes.
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
			out = append(out, fmt.Sprintf("%s.%s type=%s null=%v pk=%v len=%d auto=%v",
				table, c.Name(), strings.ToLower(c.DatabaseTypeName()), nullable, pk, length, auto))
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
	}
	sort.Strings(out)
	return out
}

func TestMigrationsMatchAutoMigrate(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			auto := o.Open(t, nil)
			if err := auto.AutoMigrate(&outbox.Message{}, &outbox.Lease{}, &outbox.Relay{}); err != nil {
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
