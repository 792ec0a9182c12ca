package outbox_test

import (
	"testing"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestMaliciousNamesRejectedBeforeSQL proves that a table or schema name
// carrying SQL is refused by every entry point before a single statement
// reaches the database.
func TestMaliciousNamesRejectedBeforeSQL(t *testing.T) {
	bad := []struct {
		name string
		cfg  outbox.Config
	}{
		{"statement in messages table", outbox.Config{MessagesTable: "outbox_messages; DROP TABLE users; --"}},
		{"quote in leases table", outbox.Config{LeasesTable: `outbox_leases" OR "1"="1`}},
		{"backtick in relays table", outbox.Config{RelaysTable: "outbox_relays`; DELETE FROM t; #"}},
		{"qualified name in table", outbox.Config{MessagesTable: "other_db.outbox_messages"}},
		{"comment in schema", outbox.Config{Schema: "public/**/;--"}},
		{"space in schema", outbox.Config{Schema: "public DROP"}},
		{"leading digit", outbox.Config{MessagesTable: "1outbox"}},
		{"too long", outbox.Config{RelaysTable: "r23456789012345678901234567890123456789012345678901234567890123x"}},
		{"unicode lookalike", outbox.Config{MessagesTable: "outbox_messageѕ"}},
	}
	testenv.ForEachDB(t, nil, func(t *testing.T, db *gorm.DB) {
		rec := &testenv.SQLRecorder{}
		db = db.Session(&gorm.Session{Logger: rec})
		if err := db.Exec("SELECT 1").Error; err != nil || len(rec.Statements()) != 1 {
			t.Fatalf("control: SELECT 1 = %v, recorded %q; want one recorded statement", err, rec.Statements())
		}
		for _, tc := range bad {
			t.Run(tc.name, func(t *testing.T) {
				rec.Reset()
				if err := tc.cfg.Validate(); err == nil {
					t.Fatalf("Validate(%+v) = nil; want an error", tc.cfg)
				}
				if err := outbox.AutoMigrate(db, tc.cfg); err == nil {
					t.Errorf("AutoMigrate = nil; want an error")
				}
				if _, err := gormstore.New(db, gormstore.Options{Config: tc.cfg}); err == nil {
					t.Errorf("gormstore.New = nil; want an error")
				}
				if err := (outbox.Plugin{Config: tc.cfg}).Initialize(db); err == nil {
					t.Errorf("Plugin.Initialize = nil; want an error")
				}
				err := db.Scopes(outbox.WithConfig(tc.cfg)).Create(outbox.NewStringMessage("orders", "k", "v")).Error
				if err == nil {
					t.Errorf("Create(WithConfig) = nil; want an error")
				}
				if got := rec.Statements(); len(got) != 0 {
					t.Errorf("statements run = %q; want none", got)
				}
			})
		}
	})
}
