package gormstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
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

// Leases returns every row of the leases table, in bucket order, rows
// outside Config.BucketCount included: what an operator's status and
// check show. One statement, bounded by Options.StatementTimeout.
func (s *Store) Leases(ctx context.Context) ([]outbox.BucketLease, error) {
	var rows []outbox.BucketLease
	err := s.read(ctx, s.leases, func(q *gorm.DB) error {
		return q.Table(s.leases).Select("bucket, owner, expires_at_ms").Order("bucket").Scan(&rows).Error
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: read %s: %w", s.leases, err)
	}
	return rows, nil
}

// Heartbeats returns every row of the relays (heartbeat) table, in relay id
// order, stopped relays included. One statement, bounded by
// Options.StatementTimeout.
func (s *Store) Heartbeats(ctx context.Context) ([]outbox.RelayHeartbeat, error) {
	var rows []outbox.RelayHeartbeat
	err := s.read(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).Select("relay_id, last_seen_ms, stopped_at_ms, features").Order("relay_id").Scan(&rows).Error
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: read %s: %w", s.relays, err)
	}
	return rows, nil
}

// BucketBacklog is what the messages table holds in one bucket.
type BucketBacklog struct {
	Bucket  int
	Pending int64 // rows not parked
	Parked  int64
	// Oldest is the oldest created_at of the pending rows; zero when there
	// are none.
	Oldest time.Time
}

// Backlog counts the pending and parked rows of every bucket that has any,
// buckets outside Config.BucketCount included, with each one's oldest
// pending row, in bucket order: one exact aggregate over the messages
// table (a scan of its (bucket, id) index, about 0.2 s per million rows on
// PostgreSQL), bounded by Options.StatementTimeout. For a gauge use
// PendingMetrics, which estimates on large tables.
func (s *Store) Backlog(ctx context.Context) ([]BucketBacklog, error) {
	var out []BucketBacklog
	err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		rows, err := q.Table(s.msgs).
			Select("bucket, COUNT(*) - COUNT(parked_at_ms), COUNT(parked_at_ms), MIN(CASE WHEN parked_at_ms IS NULL THEN created_at END)").
			Group("bucket").Order("bucket").Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b BucketBacklog
			var oldest any
			if err := rows.Scan(&b.Bucket, &b.Pending, &b.Parked, &oldest); err != nil {
				return err
			}
			if b.Oldest, err = parseTime(oldest); err != nil {
				return fmt.Errorf("bucket %d: created_at: %w", b.Bucket, err)
			}
			out = append(out, b)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: count the rows of %s: %w", s.msgs, err)
	}
	return out, nil
}
