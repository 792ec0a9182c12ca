package gormstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultLiveness is the window Fleet counts a relay live in (its
// heartbeat at most this old, and not stopped) before the store's first
// acquisition round; afterwards the window is the lease duration of the
// latest round, as for the acquisition's own count of active relays. It is
// the relay's default LeaseDuration.
const DefaultLiveness = 30 * time.Second

// maxPerStatement bounds the ids or buckets of one IN list of the parking
// statements.
const maxPerStatement = 1000

// notCorrupt is the condition that the parked row (of table alias t, ""
// for none) is not corrupt: it holds its key's later rows, and an ID
// selection of its key chooses it. The prefix is a constant of the
// statement, not an argument: the hot path's statement text is built once.
func notCorrupt(t string) string {
	if t != "" {
		t += "."
	}
	return fmt.Sprintf("COALESCE(SUBSTR(%sparked_reason, 1, %d), '') <> '%s'", t, len(relay.CorruptReasonPrefix), relay.CorruptReasonPrefix)
}

// configuredBuckets is 0..BucketCount-1.
func (s *Store) configuredBuckets() []int {
	b := make([]int, s.cfg.BucketCount)
	for i := range b {
		b[i] = i
	}
	return b
}

// allBuckets is every bucket the table may hold rows of, in chunks: 0 to
// BucketCount-1 and any bucket outside that range that has rows. The
// chunks are the bucket condition of the statements over every parked
// row, so that each reads the parked index entries instead of the table.
func (s *Store) allBuckets(ctx context.Context) ([][]int, error) {
	lo, hi := 0, s.cfg.BucketCount-1
	var lim struct{ Lo, Hi sql.NullInt64 }
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		if err := s.bucketsOutside(q).Scan(&lim).Error; err != nil || (!lim.Lo.Valid && !lim.Hi.Valid) {
			return err
		}
		return s.bucketEnds(q).Scan(&lim).Error
	}); err != nil {
		return nil, fmt.Errorf("bucket range: %w", err)
	}
	if lim.Lo.Valid {
		lo, hi = min(lo, int(lim.Lo.Int64)), max(hi, int(lim.Hi.Int64))
	}
	b := make([]int, 0, hi-lo+1)
	for i := lo; i <= hi; i++ {
		b = append(b, i)
	}
	return slices.Collect(slices.Chunk(b, maxPerStatement)), nil
}

// reasonFor returns reason as the parked_reason column can hold it on
// dialect k: valid UTF-8 without NUL bytes (PostgreSQL rejects them in
// text), ASCII on MySQL and MariaDB (whose server default character set may
// be latin1 or 3-byte utf8, which would reject the statement, and the row
// could never be parked), at most outbox.MaxParkedReasonLength characters.
func reasonFor(k int, reason string) string {
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "\uFFFD"), "\x00", "")
	if k == kindMySQL || k == kindMariaDB || k == kindUnknownMySQL {
		reason = strings.Map(func(r rune) rune {
			if r >= utf8.RuneSelf {
				return '?'
			}
			return r
		}, reason)
	}
	if utf8.RuneCountInString(reason) > outbox.MaxParkedReasonLength {
		n := 0
		for i := range reason {
			if n == outbox.MaxParkedReasonLength {
				reason = reason[:i]
				break
			}
			n++
		}
	}
	return reason
}

// Park implements relay.Store with one autocommit UPDATE of the row,
// guarded by EXISTS on relayID's unexpired lease of bucket, with "now" the
// database's clock evaluated by the statement itself. When it changes no
// row, one read of the lease tells a lost lease (an error wrapping
// relay.ErrLeaseLost) from a row already parked or gone (nil). The reason
// is stored as valid UTF-8 (ASCII on MySQL and MariaDB, other characters
// as '?'), at most outbox.MaxParkedReasonLength characters.
func (s *Store) Park(ctx context.Context, relayID string, bucket int, id int64, reason string) error {
	k, err := s.kind(ctx)
	if err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	now, err := s.nowArg(ctx)
	if err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	reason = reasonFor(k, reason)
	var n int64
	if err := s.write(ctx, s.msgs, func(q *gorm.DB) error {
		res := q.Table(s.msgs).Where("bucket = ? AND id = ? AND parked_at_ms IS NULL", bucket, id).
			Where(s.leaseHeld(relayID, bucket, now)).
			Updates(map[string]any{"parked_at_ms": now, "parked_reason": reason})
		n = res.RowsAffected
		return res.Error
	}); err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	if n > 0 {
		return nil
	}
	var held []int
	if err := s.read(ctx, s.leases, func(q *gorm.DB) error {
		return q.Table(s.leases).Where("bucket = ? AND owner = ? AND expires_at_ms > ?", bucket, relayID, now).Pluck("bucket", &held).Error
	}); err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: read the lease: %w", bucket, id, err)
	}
	if len(held) == 0 {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, relay.ErrLeaseLost)
	}
	return nil
}

// leaseHeld is the condition, for a statement on bucket's rows, that
// relayID holds bucket's lease unexpired at now (nowArg's value).
func (s *Store) leaseHeld(relayID string, bucket int, now any) clause.Expr {
	return gorm.Expr("EXISTS (SELECT 1 FROM ? WHERE bucket = ? AND owner = ? AND expires_at_ms > ?)",
		clause.Table{Name: s.leases}, bucket, relayID, now)
}

// Fleet implements relay.Store: one read of the relays table counting the
// live relays (a heartbeat within the latest round's lease duration, or
// DefaultLiveness before the first round, on the store's clock, and not
// stopped) and those of them whose heartbeat lacks the parking bit.
func (s *Store) Fleet(ctx context.Context) (relay.Fleet, error) {
	s.mu.Lock()
	window := cmp.Or(s.lease, DefaultLiveness)
	s.mu.Unlock()
	since, err := s.agoArg(ctx, window)
	if err != nil {
		return relay.Fleet{}, fmt.Errorf("gormstore: live relays: %w", err)
	}
	var f struct{ Live, Old int64 }
	if err := s.read(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).
			Select(fmt.Sprintf("COUNT(*) AS live, COALESCE(SUM(CASE WHEN (features & %d) = 0 THEN 1 ELSE 0 END), 0) AS old", Features)).
			Where("stopped_at_ms IS NULL AND last_seen_ms > ?", since).Scan(&f).Error
	}); err != nil {
		return relay.Fleet{}, fmt.Errorf("gormstore: live relays: %w", err)
	}
	return relay.Fleet{Relays: int(f.Live), CanPark: f.Old == 0}, nil
}

// ListParked implements relay.ParkAdmin: up to limit parked rows in
// (bucket, id) order, read per 1000 buckets from the parked entries of the
// (bucket, parked_at_ms, id) index. Size is LENGTH(record_key) +
// LENGTH(record_value), computed by the database (bytes on every dialect),
// so values are not transferred. MessageID is the stored text, whatever it
// holds.
func (s *Store) ListParked(ctx context.Context, limit int) ([]relay.ParkedRow, error) {
	all, err := s.allBuckets(ctx)
	if err != nil {
		return nil, fmt.Errorf("gormstore: list parked rows: %w", err)
	}
	out := []relay.ParkedRow{}
	for _, c := range all {
		left := -1
		if limit > 0 {
			left = limit - len(out)
			if left <= 0 {
				break
			}
		}
		var page []relay.ParkedRow
		err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
			page = nil
			q = q.Table(s.msgs).
				Select("id, message_id, bucket, topic, record_key, LENGTH(record_key), LENGTH(record_value), created_at, parked_at_ms, parked_reason").
				Where("bucket IN ? AND parked_at_ms IS NOT NULL", c).Order("bucket, id")
			if left > 0 {
				q = q.Limit(left)
			}
			rows, err := q.Rows()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					r           relay.ParkedRow
					msgID       any
					klen, vlen  sql.NullInt64
					created     any
					parkedAt    int64
					reason      sql.NullString
					scanTargets = []any{&r.ID, &msgID, &r.Bucket, &r.Topic, &r.Key, &klen, &vlen, &created, &parkedAt, &reason}
				)
				if err := rows.Scan(scanTargets...); err != nil {
					return err
				}
				r.MessageID = textOf(msgID)
				r.Size = int(klen.Int64 + vlen.Int64)
				if r.CreatedAt, err = parseTime(created); err != nil {
					return fmt.Errorf("row %d: created_at: %w", r.ID, err)
				}
				r.ParkedAt = time.UnixMilli(parkedAt).UTC()
				r.Reason = reason.String
				page = append(page, r)
			}
			return rows.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("gormstore: list parked rows of buckets %d-%d: %w", c[0], c[len(c)-1], err)
		}
		out = append(out, page...)
	}
	return out, nil
}

// textOf returns a scanned text column as a string.
func textOf(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case [16]byte:
		return outbox.UUID(x).String()
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

// RequeueParked implements relay.ParkAdmin: it clears parked_at_ms and
// parked_reason of the chosen rows, which then flow again in id order (they
// kept their ids), ahead of the later rows of their key. See DeleteParked
// for how the rows are chosen and locked.
func (s *Store) RequeueParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	n, err := s.alterParked(ctx, sel, false)
	if err != nil {
		return n, fmt.Errorf("gormstore: requeue parked rows (%s): %w", describe(sel), err)
	}
	return n, nil
}

// DeleteParked implements relay.ParkAdmin: it deletes the chosen parked
// rows, never an unparked one.
//
// Selection is relay.ParkedSelector.Choose's: Key chooses every parked row
// of the key in every bucket; All every parked row (both per 1000 buckets,
// over every bucket the table holds rows of, see allBuckets); ID the row
// alone when it is keyless or corrupt (reason starting with
// relay.CorruptReasonPrefix), else every parked row of its key in its
// bucket that is not corrupt. On PostgreSQL and MySQL/MariaDB
// each step is one READ COMMITTED transaction that first locks the chosen
// parked rows (SELECT id … FOR UPDATE, the ID selection's own row first)
// and then, in a second statement with the same selection, deletes (or
// requeues) them, so that the step sees the rows it locked as they are once
// locked. On SQLite each step is one statement.
func (s *Store) DeleteParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	n, err := s.alterParked(ctx, sel, true)
	if err != nil {
		return n, fmt.Errorf("gormstore: delete parked rows (%s): %w", describe(sel), err)
	}
	return n, nil
}

func describe(sel relay.ParkedSelector) string {
	switch {
	case sel.All:
		return "all"
	case sel.Key != nil:
		return fmt.Sprintf("key %q", sel.Key)
	default:
		return fmt.Sprintf("id %d", sel.ID)
	}
}

// alterParked deletes (del) or requeues the parked rows sel chooses and
// returns how many it changed.
func (s *Store) alterParked(ctx context.Context, sel relay.ParkedSelector, del bool) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	k, err := s.kind(ctx)
	if err != nil {
		return 0, err
	}
	// change locks (except on SQLite) and then changes the parked rows
	// matching where, returning how many it changed.
	change := func(q *gorm.DB, where string, args ...any) (int64, error) {
		if k != kindSQLite {
			var locked []int64
			if err := q.Table(s.msgs).Clauses(clause.Locking{Strength: "UPDATE"}).
				Where(where, args...).Where("parked_at_ms IS NOT NULL").Pluck("id", &locked).Error; err != nil {
				return 0, fmt.Errorf("lock: %w", err)
			}
		}
		stmt := q.Table(s.msgs).Where(where, args...).Where("parked_at_ms IS NOT NULL")
		var res *gorm.DB
		if del {
			res = stmt.Delete(&outbox.Message{})
		} else {
			res = stmt.Updates(map[string]any{"parked_at_ms": nil, "parked_reason": nil})
		}
		return res.RowsAffected, res.Error
	}
	// step runs one selection step: a transaction, or one statement on SQLite.
	step := func(fn func(q *gorm.DB) (int64, error)) (int64, error) {
		var n int64
		body := func(q *gorm.DB) error {
			var err error
			n, err = fn(q)
			return err
		}
		if k == kindSQLite {
			err = s.write(ctx, s.msgs, body)
		} else {
			err = s.writeTx(ctx, s.msgs, body)
		}
		return n, err
	}
	if sel.ID != 0 {
		if k == kindSQLite {
			// The row's own key and bucket, unless it is keyless or corrupt.
			sub := "FROM ? WHERE id = ? AND parked_at_ms IS NOT NULL AND record_key IS NOT NULL AND " + notCorrupt("")
			t := clause.Table{Name: s.msgs}
			return step(func(q *gorm.DB) (int64, error) {
				return change(q, "id = ? OR (bucket = (SELECT bucket "+sub+") AND record_key = (SELECT record_key "+sub+") AND "+notCorrupt("")+")",
					sel.ID, t, sel.ID, t, sel.ID)
			})
		}
		return step(func(q *gorm.DB) (int64, error) {
			var rows []struct {
				Bucket       int
				RecordKey    []byte
				ParkedReason sql.NullString
			}
			if err := q.Table(s.msgs).Clauses(clause.Locking{Strength: "UPDATE"}).
				Select("bucket, record_key, parked_reason").
				Where("id = ? AND parked_at_ms IS NOT NULL", sel.ID).Find(&rows).Error; err != nil {
				return 0, fmt.Errorf("lock row %d: %w", sel.ID, err)
			}
			if len(rows) == 0 {
				return 0, nil
			}
			r := rows[0]
			if r.RecordKey == nil || strings.HasPrefix(r.ParkedReason.String, relay.CorruptReasonPrefix) {
				return change(q, "id = ?", sel.ID)
			}
			return change(q, "bucket = ? AND record_key = ? AND "+notCorrupt(""), r.Bucket, r.RecordKey)
		})
	}
	all, err := s.allBuckets(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, c := range all {
		var n int64
		if sel.All {
			n, err = step(func(q *gorm.DB) (int64, error) { return change(q, "bucket IN ?", c) })
		} else {
			n, err = step(func(q *gorm.DB) (int64, error) { return change(q, "bucket IN ? AND record_key = ?", c, sel.Key) })
		}
		total += n
		if err != nil {
			return total, fmt.Errorf("buckets %d-%d: %w", c[0], c[len(c)-1], err)
		}
	}
	return total, nil
}
