package gormstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/relay"
)

// Now returns the time on the store's clock: the database server's (one
// SELECT, bounded by Options.StatementTimeout), or Options.Clock's time when set.
// It is the clock every lease expiry, heartbeat, stopped stamp and
// parked_at_ms of the store is written and compared with, so a tool that
// reads those columns (outbox-relay status, say) compares them with Now,
// not with its host's clock. It does not change what ClockOffset reports.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.now != nil {
		return s.now(), nil
	}
	ms, err := s.dbNow(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(ms).UTC(), nil
}

// MissingTables returns the store's tables (messages, leases, relays, as
// Config names them, schema-qualified when Config.Schema is set) that do
// not exist in the database; none when all three do. It reads the
// catalogue, bounded by Options.StatementTimeout.
func (s *Store) MissingTables(ctx context.Context) ([]string, error) {
	k, err := s.kind(ctx)
	if err != nil {
		return nil, err
	}
	schema := s.cfg.Schema
	var missing []string
	err = s.read(ctx, s.leases, func(q *gorm.DB) error {
		for _, t := range []string{s.cfg.MessagesTable, s.cfg.LeasesTable, s.cfg.RelaysTable} {
			ok, err := hasTable(q, k, schema, t)
			if err != nil {
				return fmt.Errorf("gormstore: look up table %s: %w", qualified(schema, t), err)
			}
			if !ok {
				missing = append(missing, qualified(schema, t))
			}
		}
		return nil
	})
	return missing, err
}

func qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return schema + "." + table
}

// hasTable reports whether table exists in schema (empty: the connection's
// default). gorm's Migrator().HasTable ignores a schema on MySQL and SQLite
// and turns a failed query into false; this returns the error.
func hasTable(q *gorm.DB, kind int, schema, table string) (bool, error) {
	var n int64
	var err error
	switch kind {
	case kindPostgres:
		name := `"` + table + `"`
		if schema != "" {
			name = `"` + schema + `".` + name
		}
		var ok bool
		err = q.Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&ok).Error
		return ok, err
	case kindMySQL, kindMariaDB:
		if schema == "" {
			err = q.Raw("SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table).Scan(&n).Error
		} else {
			err = q.Raw("SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?", schema, table).Scan(&n).Error
		}
	case kindSQLite:
		if schema == "" {
			schema = "main"
		}
		err = q.Raw(`SELECT count(*) FROM "`+schema+`".sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n).Error
	default:
		return q.Migrator().HasTable(qualified(schema, table)), nil
	}
	return n > 0, err
}

// explainMissingTables returns err, or, when one of the store's tables is
// missing, an error wrapping relay.ErrMisconfigured (and err) that names
// the missing tables and how to create them: no retry can fix it, so the
// relay stops instead of failing every round in its logs.
func (s *Store) explainMissingTables(ctx context.Context, err error) error {
	missing, merr := s.MissingTables(ctx)
	if merr != nil || len(missing) == 0 {
		return err
	}
	return fmt.Errorf("gormstore: missing outbox tables %s: create them with outbox.AutoMigrate (or the SQL of package migrations) before the relay runs: %w (%w)",
		strings.Join(missing, ", "), relay.ErrMisconfigured, err)
}
