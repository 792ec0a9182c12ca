package gormstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Now returns the time on the store's clock: the database server's (one
// SELECT), or Options.Clock's. Compare the store's lease, relay and park
// columns with it, not with the host's clock.
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

// MissingTables returns the store's tables (as Config names them,
// schema-qualified when Config.Schema is set) that do not exist in the
// database; none when all three do.
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

// pgName is table of schema (empty: the search path) quoted for
// to_regclass.
func pgName(schema, table string) string {
	if schema == "" {
		return `"` + table + `"`
	}
	return `"` + schema + `"."` + table + `"`
}

// hasTable reports whether table exists in schema (empty: the connection's
// default). Migrator().HasTable ignores a schema on MySQL and SQLite and
// turns a failed query into false.
func hasTable(q *gorm.DB, kind int, schema, table string) (bool, error) {
	var n int64
	var err error
	switch kind {
	case kindPostgres:
		var ok bool
		err = q.Raw("SELECT to_regclass(?) IS NOT NULL", pgName(schema, table)).Scan(&ok).Error
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

// explainMissingTables returns err or, when a store table is missing, an
// error wrapping relay.ErrMisconfigured that says how to create it: no
// retry can fix it, so the relay stops.
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
// outside Config.BucketCount included, with each one's oldest pending row,
// in bucket order: one exact aggregate (for a gauge use PendingMetrics).
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

// MissingColumns returns the columns of table (as Config names it,
// schema-qualified) that a SELECT cannot read: one probe of all of them
// reading no row, then one per column if it fails. If every column fails,
// the table cannot be read at all, which is an error.
func (s *Store) MissingColumns(ctx context.Context, table string, columns []string) ([]string, error) {
	probe := func(cols []string) error {
		return s.read(ctx, table, func(q *gorm.DB) error {
			rows, err := q.Table(table).Select(strings.Join(cols, ", ")).Where("1 = 0").Rows()
			if err != nil {
				return err
			}
			return rows.Close()
		})
	}
	allErr := probe(columns)
	if allErr == nil || ctx.Err() != nil {
		return nil, allErr
	}
	var missing []string
	for _, col := range columns {
		if probe([]string{col}) != nil {
			missing = append(missing, col)
		}
	}
	if len(missing) == len(columns) {
		return nil, fmt.Errorf("gormstore: read %s: %w", table, allErr)
	}
	return missing, nil
}

// Index is one index of a table, or its primary key.
type Index struct {
	Name    string
	Unique  bool
	Partial bool
	// Columns are the key columns in order; "" for an expression.
	Columns []string
}

// Indexes lists the indexes of table (unqualified; in Config.Schema when
// set), its primary key included, from the database's catalogue.
func (s *Store) Indexes(ctx context.Context, table string) ([]Index, error) {
	k, err := s.kind(ctx)
	if err != nil {
		return nil, err
	}
	var out []Index
	add := func(name string, unique, partial bool, col string) {
		if len(out) == 0 || out[len(out)-1].Name != name {
			out = append(out, Index{Name: name, Unique: unique, Partial: partial})
		}
		out[len(out)-1].Columns = append(out[len(out)-1].Columns, col)
	}
	schema := s.cfg.Schema
	err = s.read(ctx, table, func(q *gorm.DB) error {
		out = out[:0]
		var rows *sql.Rows
		var err error
		switch k {
		case kindPostgres:
			rows, err = q.Raw(`SELECT i.relname, x.indisunique, x.indpred IS NOT NULL, COALESCE(a.attname, '')
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
WHERE x.indrelid = to_regclass(?) AND k.n <= x.indnkeyatts
ORDER BY i.relname, k.n`, pgName(schema, table)).Rows()
		case kindMySQL, kindMariaDB:
			rows, err = q.Raw(`SELECT INDEX_NAME, NON_UNIQUE = 0, FALSE, COALESCE(COLUMN_NAME, '')
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?
ORDER BY INDEX_NAME, SEQ_IN_INDEX`, schema, table).Rows()
		case kindSQLite:
			sch := cmp.Or(schema, "main")
			// The primary key (a rowid alias has no index of its own), then
			// each index's key columns.
			var pk []string
			if err := q.Raw(`SELECT name FROM pragma_table_info(?, ?) WHERE pk > 0 ORDER BY pk`, table, sch).Scan(&pk).Error; err != nil {
				return err
			}
			for _, col := range pk {
				add("PRIMARY KEY", true, false, col)
			}
			rows, err = q.Raw(`SELECT il.name, il."unique", il.partial, COALESCE(ii.name, '')
FROM pragma_index_list(?, ?) AS il, pragma_index_info(il.name, ?) AS ii
ORDER BY il.name, ii.seqno`, table, sch, sch).Rows()
		default:
			return fmt.Errorf("no index catalogue for dialect %q", s.db.Dialector.Name())
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, col string
			var unique, partial bool
			if err := rows.Scan(&name, &unique, &partial, &col); err != nil {
				return err
			}
			add(name, unique, partial, col)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: list the indexes of %s: %w", qualified(schema, table), err)
	}
	return out, nil
}

// BucketRows is a bucket and how many rows it holds.
type BucketRows struct {
	Bucket int
	Rows   int64 `gorm:"column:n"` // not "rows": a reserved word on MariaDB
}

// RowsOutsideBuckets counts the rows of every bucket outside
// [0, Config.BucketCount): rows of writers with a larger count, which no
// relay of this count publishes. One statement on the (bucket, …) index.
func (s *Store) RowsOutsideBuckets(ctx context.Context) ([]BucketRows, error) {
	var out []BucketRows
	err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).Select("bucket, COUNT(*) AS n").Where("bucket < ? OR bucket >= ?", 0, s.cfg.BucketCount).
			Group("bucket").Order("bucket").Scan(&out).Error
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: probe %s for buckets outside %d: %w", s.msgs, s.cfg.BucketCount, err)
	}
	return out, nil
}

// RowPlacement is what decides a row's bucket: its key, its explicit
// partition and, for a keyless row, its message id (outbox.BucketOf).
type RowPlacement struct {
	ID        int64
	Bucket    int
	Key       []byte
	Partition *int32
	MessageID outbox.UUID
	// IDErr is set when message_id is not a UUID: a corrupt row, whose
	// bucket cannot be computed when it has no key.
	IDErr error
}

// NewestRows returns the placement of the newest n rows, newest first.
func (s *Store) NewestRows(ctx context.Context, n int) ([]RowPlacement, error) {
	var out []RowPlacement
	err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		rows, err := q.Table(s.msgs).Select("id, bucket, record_key, record_partition, message_id").Order("id DESC").Limit(n).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		out, err = scanPlacements(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gormstore: read the newest rows of %s: %w", s.msgs, err)
	}
	return out, nil
}

// scanPlacements reads rows of (id, bucket, record_key, record_partition,
// message_id).
func scanPlacements(rows *sql.Rows) ([]RowPlacement, error) {
	var out []RowPlacement
	for rows.Next() {
		var r RowPlacement
		var part sql.NullInt32
		var id uuidCol
		if err := rows.Scan(&r.ID, &r.Bucket, &r.Key, &part, &id); err != nil {
			return nil, err
		}
		if part.Valid {
			r.Partition = &part.Int32
		}
		r.MessageID, r.IDErr = id.v, id.err
		out = append(out, r)
	}
	return out, rows.Err()
}
