package gormstore

import (
	"context"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// maxExistsPerStatement bounds the EXISTS columns of one BucketsWithPending
// statement (PostgreSQL allows 1664 result columns).
const maxExistsPerStatement = 1000

// maxIDsPerDelete bounds the ids of one MarkPublished DELETE.
const maxIDsPerDelete = 1000

// BucketsWithPending implements relay.Store with one statement (per 1000
// buckets) selecting an EXISTS probe per requested bucket:
//
//	SELECT EXISTS (SELECT 1 FROM messages WHERE bucket = $1), EXISTS (…$2), …
//
// Each probe is a single lookup in the (bucket, id) index, so the cost does
// not grow with the backlog, unlike SELECT DISTINCT bucket … WHERE bucket IN,
// which walks every pending row of the requested buckets.
func (s *Store) BucketsWithPending(ctx context.Context, buckets []int) ([]int, error) {
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	out := []int{}
	for len(buckets) > 0 {
		chunk := buckets[:min(len(buckets), maxExistsPerStatement)]
		buckets = buckets[len(chunk):]
		var sql strings.Builder
		args := make([]any, 0, 2*len(chunk))
		sql.WriteString("SELECT ")
		for i, b := range chunk {
			if i > 0 {
				sql.WriteString(", ")
			}
			sql.WriteString("EXISTS (SELECT 1 FROM ? WHERE bucket = ?)")
			args = append(args, clause.Table{Name: s.msgs}, b)
		}
		vals := make([]any, len(chunk))
		if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
			rows, err := q.Raw(s.rawPrefix()+sql.String(), args...).Rows()
			if err != nil {
				return err
			}
			defer rows.Close()
			ptrs := make([]any, len(chunk))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if rows.Next() {
				if err := rows.Scan(ptrs...); err != nil {
					return err
				}
			}
			return rows.Err()
		}); err != nil {
			return nil, fmt.Errorf("gormstore: probe pending buckets: %w", err)
		}
		for i, v := range vals {
			if truthy(v) {
				out = append(out, chunk[i])
			}
		}
	}
	return out, nil
}

// truthy reads an EXISTS result: a bool on PostgreSQL, an integer on MySQL
// and SQLite.
func truthy(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case int64:
		return x != 0
	case []byte:
		return len(x) > 0 && string(x) != "0" && string(x) != "f" && string(x) != "false"
	case string:
		return x != "" && x != "0" && x != "f" && x != "false"
	default:
		return false
	}
}

// ConcurrentNextBatch implements relay.ConcurrentFetcher: on PostgreSQL and
// MySQL/MariaDB the relay may fetch one bucket's next batch while it
// publishes and deletes another's. Not on SQLite, whose single writer makes
// the overlap contention rather than speed.
func (s *Store) ConcurrentNextBatch() bool { return s.db.Dialector.Name() != "sqlite" }

// NextBatch implements relay.Store:
//
//	SELECT * FROM messages WHERE bucket >= $1 AND bucket <= $1 ORDER BY bucket, id LIMIT $2
func (s *Store) NextBatch(ctx context.Context, bucket, limit int) ([]*outbox.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	var rows []batchRow
	// "bucket >= ? AND bucket <= ?" with ORDER BY bucket, id, not "bucket = ?"
	// with ORDER BY id: with the equality, PostgreSQL's planner often walks
	// the primary key in id order and filters by bucket, reading every row
	// of the other buckets (and every dead row) ahead of this bucket's head:
	// 130 ms instead of under 1 ms per batch once the buckets drift apart.
	// The range form matches only the (bucket, id) index's order.
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).Where("bucket >= ? AND bucket <= ?", bucket, bucket).Order("bucket, id").Limit(limit).Find(&rows).Error
	}); err != nil {
		return nil, fmt.Errorf("gormstore: bucket %d: next batch: %w", bucket, err)
	}
	msgs := make([]*outbox.Message, len(rows))
	for i := range rows {
		r := &rows[i]
		msgs[i] = &outbox.Message{
			ID: r.ID, MessageID: r.MessageID, Bucket: r.Bucket, Topic: r.Topic,
			Key: r.Key, Value: r.Value, Headers: r.Headers, Partition: r.Partition,
			CreatedAt: r.CreatedAt.Time,
		}
	}
	return msgs, nil
}

// MarkPublished implements relay.Store: it deletes exactly the given rows of
// bucket, by primary key (in statements of at most 1000 ids):
//
//	DELETE FROM messages WHERE bucket = $1 AND id IN ($2, …)
func (s *Store) MarkPublished(ctx context.Context, bucket int, published []*outbox.Message) error {
	ids := make([]int64, 0, len(published))
	for _, m := range published {
		ids = append(ids, m.ID)
	}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), maxIDsPerDelete)]
		ids = ids[len(chunk):]
		if err := s.write(ctx, s.msgs, func(q *gorm.DB) error {
			return q.Table(s.msgs).Where("bucket = ? AND id IN ?", bucket, chunk).Delete(&outbox.Message{}).Error
		}); err != nil {
			return fmt.Errorf("gormstore: bucket %d: mark %d published: %w", bucket, len(chunk), err)
		}
	}
	return nil
}

// PendingMetrics implements relay.PendingMetricsStore with one aggregate
// query on ctx:
//
//	SELECT COUNT(*), MIN(created_at) FROM messages
//
// On SQLite, where the minimum comes back as text, it is parsed.
func (s *Store) PendingMetrics(ctx context.Context) (*relay.Pending, error) {
	var count int64
	var oldest any
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).Select("COUNT(*), MIN(created_at)").Row().Scan(&count, &oldest)
	}); err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: %w", err)
	}
	t, err := parseTime(oldest)
	if err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: oldest created_at: %w", err)
	}
	return &relay.Pending{Count: count, Oldest: t}, nil
}

// batchRow is a row of the messages table as NextBatch reads it: the
// columns of outbox.Message, with created_at read by the store itself, so
// that a MySQL DSN without parseTime=true (the driver's default), which
// returns DATETIME as text, works as well as one with it.
type batchRow struct {
	ID        int64          `gorm:"column:id"`
	MessageID outbox.UUID    `gorm:"column:message_id"`
	Bucket    int32          `gorm:"column:bucket"`
	Topic     string         `gorm:"column:topic"`
	Key       []byte         `gorm:"column:record_key"`
	Value     []byte         `gorm:"column:record_value"`
	Headers   outbox.Headers `gorm:"column:headers"`
	Partition *int32         `gorm:"column:record_partition"`
	CreatedAt scannedTime    `gorm:"column:created_at"`
}

// scannedTime reads a timestamp column whatever form the driver returns
// it in: a time.Time, or text (MySQL without parseTime, SQLite) in one of
// timeLayouts, taken as UTC when it carries no offset. The result is UTC.
type scannedTime struct{ Time time.Time }

// Scan implements sql.Scanner.
func (t *scannedTime) Scan(v any) error {
	x, err := parseTime(v)
	if err != nil {
		return fmt.Errorf("created_at: %w", err)
	}
	t.Time = x
	return nil
}

// Value implements driver.Valuer (GORM requires it of a struct column
// type); the store never writes a scannedTime.
func (t scannedTime) Value() (driver.Value, error) { return t.Time, nil }

// timeLayouts are the textual forms a timestamp comes back in: SQLite's
// (as mattn/go-sqlite3 writes time.Time), RFC 3339, and MySQL's without
// parseTime.
var timeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999Z07:00",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04",
	"2006-01-02T15:04",
	"2006-01-02",
}

func parseTime(v any) (time.Time, error) {
	var s string
	switch x := v.(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return x.UTC(), nil
	case []byte:
		s = string(x)
	case string:
		s = x
	case int64: // Unix seconds, if a column was written that way.
		return time.Unix(x, 0).UTC(), nil
	default:
		return time.Time{}, fmt.Errorf("unexpected %T", v)
	}
	s = strings.TrimSuffix(strings.TrimSpace(s), "Z")
	if strings.HasSuffix(s, "+00:00") || strings.HasSuffix(s, "-00:00") {
		s = s[:len(s)-6]
	}
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("unparsable timestamp %q", s)
}
