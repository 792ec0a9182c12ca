package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultLiveness is the window FleetCanPark counts a relay live in (its
// heartbeat at most this old, and not stopped) before the store's first
// acquisition round; afterwards the window is the lease duration of the
// latest round, as for the acquisition's own count of active relays. It is
// the relay's default LeaseDuration.
const DefaultLiveness = 30 * time.Second

// maxPerStatement bounds the ids or buckets of one IN list of the parking
// statements.
const maxPerStatement = 1000

// chunks splits xs into slices of at most maxPerStatement elements.
func chunks[T any](xs []T) [][]T {
	var out [][]T
	for len(xs) > 0 {
		n := min(len(xs), maxPerStatement)
		out = append(out, xs[:n])
		xs = xs[n:]
	}
	return out
}

// allBuckets is 0..BucketCount-1 in chunks: the bucket condition of the
// statements over every parked row, so that each one reads the parked
// entries of the (bucket, parked_at_ms, id) index instead of the table.
func (s *Store) allBuckets() [][]int {
	b := make([]int, s.cfg.BucketCount)
	for i := range b {
		b[i] = i
	}
	return chunks(b)
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

// Park implements relay.Parker with one autocommit statement:
//
//	UPDATE messages SET parked_at_ms = $now, parked_reason = $reason
//	WHERE bucket = $1 AND id = $2 AND parked_at_ms IS NULL
//
// now is the database's clock in Unix milliseconds, evaluated by the
// statement itself (Options.Clock when set). The reason is stored as valid
// UTF-8 (ASCII on MySQL and MariaDB, other characters as '?'), at most
// outbox.MaxParkedReasonLength characters.
func (s *Store) Park(ctx context.Context, bucket int, id int64, reason string) error {
	k, err := s.kind(ctx)
	if err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	now, err := s.nowArg(ctx)
	if err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	reason = reasonFor(k, reason)
	if err := s.write(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).Where("bucket = ? AND id = ? AND parked_at_ms IS NULL", bucket, id).
			Updates(map[string]any{"parked_at_ms": now, "parked_reason": reason}).Error
	}); err != nil {
		return fmt.Errorf("gormstore: bucket %d: park row %d: %w", bucket, id, err)
	}
	return nil
}

// HoldBehind implements relay.Parker. On PostgreSQL and MySQL/MariaDB it is
// one READ COMMITTED transaction:
//
//	SELECT id FROM messages WHERE bucket = $1 AND id = $head AND parked_at_ms IS NOT NULL FOR UPDATE
//	-- no row: the head was requeued or deleted; change nothing, return false
//	UPDATE messages SET parked_at_ms = $now, parked_reason = 'held behind parked row <head>'
//	WHERE bucket = $1 AND id IN (…) AND parked_at_ms IS NULL   -- per 1000 ids
//
// The head's row lock orders it against RequeueParked and DeleteParked,
// which lock the parked rows of the key first: a requeue that committed
// first leaves the head unparked (false); one that waits for this
// transaction then sees the held rows and requeues them too. On SQLite (one
// writer at a time) each UPDATE carries the head check as an EXISTS
// subquery, in one transaction when there are more than 1000 ids.
func (s *Store) HoldBehind(ctx context.Context, bucket int, head int64, ids []int64) (bool, error) {
	k, err := s.kind(ctx)
	if err != nil {
		return false, fmt.Errorf("gormstore: bucket %d: hold rows behind %d: %w", bucket, head, err)
	}
	now, err := s.nowArg(ctx)
	if err != nil {
		return false, fmt.Errorf("gormstore: bucket %d: hold rows behind %d: %w", bucket, head, err)
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	set := map[string]any{"parked_at_ms": now, "parked_reason": relay.HeldReasonPrefix + strconv.FormatInt(head, 10)}
	headParked := func(q *gorm.DB) (bool, error) {
		var got []int64
		if k != kindSQLite {
			q = q.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		err := q.Table(s.msgs).Where("bucket = ? AND id = ? AND parked_at_ms IS NOT NULL", bucket, head).Pluck("id", &got).Error
		return len(got) > 0, err
	}
	held := false
	run := func(q *gorm.DB) error {
		held = false
		if k == kindSQLite {
			// The UPDATEs come first: the first one takes the write lock, so
			// that the final read sees what they saw.
			for _, c := range chunks(ids) {
				if err := q.Table(s.msgs).
					Where("bucket = ? AND id IN ? AND parked_at_ms IS NULL", bucket, c).
					Where("EXISTS (SELECT 1 FROM ? WHERE bucket = ? AND id = ? AND parked_at_ms IS NOT NULL)", clause.Table{Name: s.msgs}, bucket, head).
					Updates(set).Error; err != nil {
					return err
				}
			}
			var err error
			held, err = headParked(q)
			return err
		}
		ok, err := headParked(q)
		if err != nil || !ok {
			return err
		}
		for _, c := range chunks(ids) {
			if err := q.Table(s.msgs).Where("bucket = ? AND id IN ? AND parked_at_ms IS NULL", bucket, c).Updates(set).Error; err != nil {
				return err
			}
		}
		held = true
		return nil
	}
	if k == kindSQLite && len(ids) <= maxPerStatement && len(ids) > 0 {
		// One statement is atomic; the read after it only tells whether the
		// head was parked (it changes nothing either way).
		err = s.write(ctx, s.msgs, run)
	} else {
		err = s.writeTx(ctx, s.msgs, run)
	}
	if err != nil {
		return false, fmt.Errorf("gormstore: bucket %d: hold %d rows behind parked row %d: %w", bucket, len(ids), head, err)
	}
	return held, nil
}

// ParkedHeads implements relay.Parker: per 1000 buckets one read of the
// parked rows with a key,
//
//	SELECT bucket, id, record_key, parked_reason FROM messages
//	WHERE bucket IN (…) AND parked_at_ms IS NOT NULL AND record_key IS NOT NULL
//	ORDER BY bucket, id
//
// (the parked entries of the (bucket, parked_at_ms, id) index), grouped by
// (bucket, key) in Go, exactly: MySQL groups BLOBs by their first
// max_sort_length bytes only, and its LIKE ignores case. Rows whose reason
// starts with relay.CorruptReasonPrefix or relay.HeldReasonPrefix are not
// heads.
func (s *Store) ParkedHeads(ctx context.Context, buckets []int) ([]relay.ParkedHead, error) {
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	out := []relay.ParkedHead{}
	for _, c := range chunks(buckets) {
		type seenKey struct {
			bucket int
			key    string
		}
		var heads []relay.ParkedHead
		err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
			heads = nil
			seen := map[seenKey]bool{}
			rows, err := q.Table(s.msgs).Select("bucket, id, record_key, parked_reason").
				Where("bucket IN ? AND parked_at_ms IS NOT NULL AND record_key IS NOT NULL", c).
				Order("bucket, id").Rows()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					bucket int
					id     int64
					key    []byte
					reason sql.NullString
				)
				if err := rows.Scan(&bucket, &id, &key, &reason); err != nil {
					return err
				}
				if strings.HasPrefix(reason.String, relay.CorruptReasonPrefix) || strings.HasPrefix(reason.String, relay.HeldReasonPrefix) {
					continue
				}
				sk := seenKey{bucket, string(key)}
				if seen[sk] {
					continue
				}
				seen[sk] = true
				if key == nil {
					key = []byte{}
				}
				heads = append(heads, relay.ParkedHead{Bucket: bucket, Key: key, ID: id})
			}
			return rows.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("gormstore: parked heads of %d buckets from %d: %w", len(c), c[0], err)
		}
		out = append(out, heads...)
	}
	return out, nil
}

// FleetCanPark implements relay.Parker with one read: is there a live
// relay (heartbeat newer than now minus the liveness window, not stopped)
// whose heartbeat lacks the parking bit?
//
//	SELECT relay_id FROM relays
//	WHERE stopped_at_ms IS NULL AND last_seen_ms > $now - $window AND (features & 1) = 0 LIMIT 1
//
// $now is the database's clock, evaluated by the statement (Options.Clock
// when set).
// The window is the lease duration of this store's latest acquisition
// round (the window the acquisition counts active relays in), or
// DefaultLiveness before the first round.
func (s *Store) FleetCanPark(ctx context.Context) (bool, error) {
	s.mu.Lock()
	window := s.lease
	s.mu.Unlock()
	if window <= 0 {
		window = DefaultLiveness
	}
	since, err := s.agoArg(ctx, window)
	if err != nil {
		return false, fmt.Errorf("gormstore: relays without parking support: %w", err)
	}
	var old []string
	if err := s.read(ctx, s.relays, func(q *gorm.DB) error {
		return q.Table(s.relays).
			Where(fmt.Sprintf("stopped_at_ms IS NULL AND last_seen_ms > ? AND (features & %d) = 0", Features), since).
			Limit(1).Pluck("relay_id", &old).Error
	}); err != nil {
		return false, fmt.Errorf("gormstore: relays without parking support: %w", err)
	}
	return len(old) == 0, nil
}

// ListParked implements relay.ParkAdmin: up to limit parked rows in
// (bucket, id) order, read per 1000 buckets from the parked entries of the
// (bucket, parked_at_ms, id) index. Size is LENGTH(record_key) +
// LENGTH(record_value), computed by the database (bytes on every dialect),
// so values are not transferred. MessageID is the stored text, whatever it
// holds.
func (s *Store) ListParked(ctx context.Context, limit int) ([]relay.ParkedRow, error) {
	out := []relay.ParkedRow{}
	for _, c := range s.allBuckets() {
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
// Selection: Key chooses every parked row of the key in every bucket; All
// every parked row (both per 1000 buckets); ID the row alone when it is
// keyless or corrupt (reason starting with relay.CorruptReasonPrefix), else
// every parked row of its key in its bucket. On PostgreSQL and MySQL/MariaDB
// each step is one READ COMMITTED transaction that first locks the chosen
// parked rows (SELECT id … FOR UPDATE, the ID selection's own row first)
// and then, in a second statement with the same selection, deletes (or
// requeues) them: a HoldBehind holding the key's head lock makes the lock
// wait, and the second statement, reading anew, also finds the rows it held
// behind the head; a later HoldBehind finds the head gone and changes
// nothing. On SQLite each step is one statement.
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
			sub := fmt.Sprintf("FROM ? WHERE id = ? AND parked_at_ms IS NOT NULL AND record_key IS NOT NULL AND COALESCE(substr(parked_reason, 1, %d), '') <> ?", len(relay.CorruptReasonPrefix))
			t := clause.Table{Name: s.msgs}
			return step(func(q *gorm.DB) (int64, error) {
				return change(q, "id = ? OR (bucket = (SELECT bucket "+sub+") AND record_key = (SELECT record_key "+sub+"))",
					sel.ID, t, sel.ID, relay.CorruptReasonPrefix, t, sel.ID, relay.CorruptReasonPrefix)
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
			return change(q, "bucket = ? AND record_key = ?", r.Bucket, r.RecordKey)
		})
	}
	var total int64
	for _, c := range s.allBuckets() {
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
