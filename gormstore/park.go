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

// DefaultLiveness is the window Fleet counts a relay live in before the
// store's first acquisition round (afterwards the latest round's lease
// duration): the relay's default LeaseDuration.
const DefaultLiveness = 30 * time.Second

// maxPerStatement bounds the ids or buckets of one IN list of the parking
// statements.
const maxPerStatement = 1000

// notCorrupt is the condition that the parked row (of table alias t, ""
// for none) is not corrupt, so that it holds its key's later rows. The
// prefix is written in, not bound: the hot path's text is built once.
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

// allBuckets is, in chunks, every bucket the table may hold rows of: the
// configured ones and any outside them that hold rows. The chunks bound
// the statements over every parked row to the parked index entries.
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

// reasonFor returns reason as parked_reason can hold it on dialect k: valid
// UTF-8 without NUL bytes (PostgreSQL rejects them), ASCII on MySQL and
// MariaDB (a latin1 or 3-byte utf8 column would reject the statement, and
// the row could never be parked), at most outbox.MaxParkedReasonLength
// characters.
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

// Park implements relay.Store with one autocommit UPDATE guarded by
// relayID's unexpired lease of bucket on the store's clock. When it changes
// no row, a read of the lease tells a lost lease (an error wrapping
// relay.ErrLeaseLost) from a row already parked or gone (nil).
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

// Fleet implements relay.Store: one read counting the live relays (a
// heartbeat within the latest round's lease duration, or DefaultLiveness,
// and not stopped) and those whose heartbeat lacks the parking bit.
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
// (bucket, id) order, read per 1000 buckets from the parked index entries.
// Size is computed by the database, so values are not transferred;
// MessageID is the stored text, whatever it holds.
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

// RequeueParked implements relay.ParkAdmin: it clears the parking columns
// of the chosen rows, which then flow again in id order ahead of their
// key's later rows. See DeleteParked for how rows are chosen and locked.
func (s *Store) RequeueParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	n, err := s.alterParked(ctx, sel, false)
	if err != nil {
		return n, fmt.Errorf("gormstore: requeue parked rows (%s): %w", describe(sel), err)
	}
	return n, nil
}

// DeleteParked implements relay.ParkAdmin: it deletes the chosen parked
// rows, never an unparked one. Key and All choose per 1000 buckets over
// every bucket the table holds rows of; ID chooses the row alone when it is
// keyless or corrupt, else every parked, not corrupt row of its key in its
// bucket. Except on SQLite, each step is one READ COMMITTED transaction
// that locks the chosen rows (the ID selection's own row first) and then
// changes them with the same selection, seeing them as they are once
// locked.
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
