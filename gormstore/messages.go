package gormstore

import (
	"context"
	"database/sql"
	"errors"
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
// buckets) selecting, per requested bucket, the id of its head (the oldest
// unparked row), NULL when it has none:
//
//	SELECT (SELECT id FROM messages
//	        WHERE bucket >= $1 AND bucket <= $1 AND parked_at_ms IS NULL
//	        ORDER BY bucket, parked_at_ms, id LIMIT 1),
//	       (… $2 …), …
//
// Each probe is NextBatch's query with LIMIT 1: a single lookup in the
// (bucket, parked_at_ms, id) index, so the cost grows neither with the
// backlog nor with the parked rows, unlike SELECT DISTINCT bucket … WHERE
// bucket IN, which walks every pending row of the requested buckets. Not
// EXISTS (SELECT 1 … WHERE bucket = $1 …): PostgreSQL drops the ORDER BY of
// an EXISTS subquery and, when a bucket's rows look plentiful, plans a
// sequential scan that stops at the first match — in heap order, after
// every dead or parked row ahead of it. A bucket holding only parked rows
// has none pending.
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
			sql.WriteString("(SELECT id FROM ? WHERE bucket >= ? AND bucket <= ? AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT 1)")
			args = append(args, clause.Table{Name: s.msgs}, b, b)
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
			if v != nil {
				out = append(out, chunk[i])
			}
		}
	}
	return out, nil
}

// ConcurrentNextBatch implements relay.ConcurrentFetcher: on PostgreSQL and
// MySQL/MariaDB the relay may fetch one bucket's next batch while it
// publishes and deletes another's. Not on SQLite, whose single writer makes
// the overlap contention rather than speed.
func (s *Store) ConcurrentNextBatch() bool { return s.db.Dialector.Name() != "sqlite" }

// NextBatch implements relay.Store: the oldest unparked rows of bucket,
//
//	SELECT id, message_id, … FROM messages
//	WHERE bucket >= $1 AND bucket <= $1 AND parked_at_ms IS NULL
//	ORDER BY bucket, parked_at_ms, id LIMIT $2
//
// Each row is decoded in Go (the message id and the headers are scanned as
// raw bytes). A row it cannot decode — a message id that is not a UUID (MySQL
// and SQLite store it as text), a header blob of an unknown codec version, an
// unparsable created_at — ends the batch: the rows before it are returned
// with a nil error, and when it is the first row NextBatch returns a
// *relay.CorruptRowError naming it, for the relay to park it.
func (s *Store) NextBatch(ctx context.Context, bucket, limit int) ([]*outbox.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	var msgs []*outbox.Message
	var corrupt *relay.CorruptRowError
	// "bucket >= ? AND bucket <= ?" with ORDER BY bucket, parked_at_ms, id,
	// not "bucket = ?" with ORDER BY id: with the equality, PostgreSQL's
	// planner often walks the primary key in id order and filters by bucket,
	// reading every row of the other buckets (and every dead row) ahead of
	// this bucket's head: 130 ms instead of under 1 ms per batch once the
	// buckets drift apart. The range form (with parked_at_ms, constant NULL
	// here, in the ORDER BY) matches only the (bucket, parked_at_ms, id)
	// index's order, which PostgreSQL then walks from the bucket's first
	// unparked entry, never reading the parked ones, without a sort.
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		msgs, corrupt = nil, nil
		rows, err := q.Table(s.msgs).Select(batchColumns).
			Where("bucket >= ? AND bucket <= ? AND parked_at_ms IS NULL", bucket, bucket).
			Order("bucket, parked_at_ms, id").Limit(limit).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r rawRow
			if err := rows.Scan(&r.id, &r.messageID, &r.bucket, &r.topic, &r.key, &r.value, &r.headers, &r.partition, &r.createdAt); err != nil {
				return err
			}
			m, err := r.decode()
			if err != nil {
				if len(msgs) == 0 {
					corrupt = &relay.CorruptRowError{ID: r.id, Bucket: int(r.bucket), Err: err}
				}
				break
			}
			msgs = append(msgs, m)
		}
		return rows.Err()
	}); err != nil {
		return nil, fmt.Errorf("gormstore: bucket %d: next batch: %w", bucket, err)
	}
	if corrupt != nil {
		return nil, corrupt
	}
	return msgs, nil
}

// batchColumns are the columns NextBatch reads, in rawRow's scan order.
const batchColumns = "id, message_id, bucket, topic, record_key, record_value, headers, record_partition, created_at"

// rawRow is a row of the messages table as NextBatch scans it: nothing that
// can fail to decode is decoded by the driver, so that a corrupt row is told
// apart from a failing read. created_at is read by the store itself, so that
// a MySQL DSN without parseTime=true (the driver's default), which returns
// DATETIME as text, works as well as one with it.
type rawRow struct {
	id        int64
	messageID any // uuid text, as a string or []byte
	bucket    int32
	topic     string
	key       []byte
	value     []byte
	headers   []byte
	partition sql.NullInt32
	createdAt any // time.Time, or text (SQLite, MySQL without parseTime)
}

// messageIDOf decodes a stored message id: text in a form uuid.Parse
// accepts (never 16 raw bytes: in a text column, 16 characters are not a
// UUID).
func messageIDOf(v any) (outbox.UUID, error) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	case nil:
		return outbox.UUID{}, errors.New("message_id is NULL")
	default:
		return outbox.UUID{}, fmt.Errorf("message_id: unexpected %T", v)
	}
	return outbox.ParseUUID(s)
}

func (r *rawRow) decode() (*outbox.Message, error) {
	id, err := messageIDOf(r.messageID)
	if err != nil {
		return nil, err
	}
	h, err := outbox.DecodeHeaders(r.headers)
	if err != nil {
		return nil, err
	}
	created, err := parseTime(r.createdAt)
	if err != nil {
		return nil, fmt.Errorf("created_at: %w", err)
	}
	m := &outbox.Message{
		ID: r.id, MessageID: id, Bucket: r.bucket, Topic: r.topic,
		Key: r.key, Value: r.value, Headers: h, CreatedAt: created,
	}
	if r.partition.Valid {
		p := r.partition.Int32
		m.Partition = &p
	}
	return m, nil
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
//	SELECT COUNT(*) - COUNT(parked_at_ms),
//	       MIN(CASE WHEN parked_at_ms IS NULL THEN created_at END),
//	       COUNT(parked_at_ms)
//	FROM messages
//
// Count and Oldest are of the unparked rows, Parked counts the parked ones.
// On SQLite, where the minimum comes back as text, it is parsed.
func (s *Store) PendingMetrics(ctx context.Context) (*relay.Pending, error) {
	var count, parked int64
	var oldest any
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).
			Select("COUNT(*) - COUNT(parked_at_ms), MIN(CASE WHEN parked_at_ms IS NULL THEN created_at END), COUNT(parked_at_ms)").
			Row().Scan(&count, &oldest, &parked)
	}); err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: %w", err)
	}
	t, err := parseTime(oldest)
	if err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: oldest created_at: %w", err)
	}
	return &relay.Pending{Count: count, Oldest: t, Parked: parked}, nil
}

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
