package gormstore

import (
	"context"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gorm-outbox/outbox"
)

// rebucketBatch is how many rows Rebucket reads per statement when it
// rehashes, and how many lease rows it creates per statement.
const rebucketBatch = 1000

// RebucketState is what the tables hold when a bucket-count change is
// decided: every lease row and heartbeat, and the messages table's pending
// and parked rows.
type RebucketState struct {
	Leases     []outbox.BucketLease
	Heartbeats []outbox.RelayHeartbeat
	Pending    int64
	Parked     int64
}

// RebucketState reads the state a bucket-count change is decided on: three
// statements, each bounded by Options.StatementTimeout.
func (s *Store) RebucketState(ctx context.Context) (*RebucketState, error) {
	return s.readRebucketState(func(f func(*gorm.DB) error) error {
		qctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		return f(s.primary(qctx, s.leases))
	})
}

// readRebucketState reads the state through step, which runs one
// statement (in a transaction, or not).
func (s *Store) readRebucketState(step func(func(*gorm.DB) error) error) (*RebucketState, error) {
	st := &RebucketState{}
	if err := step(func(q *gorm.DB) error {
		return q.Table(s.leases).Select("bucket, owner, expires_at_ms").Order("bucket").Scan(&st.Leases).Error
	}); err != nil {
		return nil, fmt.Errorf("gormstore: read %s: %w", s.leases, err)
	}
	if err := step(func(q *gorm.DB) error {
		return q.Table(s.relays).Select("relay_id, last_seen_ms, stopped_at_ms, features").Order("relay_id").Scan(&st.Heartbeats).Error
	}); err != nil {
		return nil, fmt.Errorf("gormstore: read %s: %w", s.relays, err)
	}
	if err := step(func(q *gorm.DB) error {
		return q.Table(s.msgs).Select("COUNT(*) - COUNT(parked_at_ms), COUNT(parked_at_ms)").Row().Scan(&st.Pending, &st.Parked)
	}); err != nil {
		return nil, fmt.Errorf("gormstore: count the rows of %s: %w", s.msgs, err)
	}
	return st, nil
}

// RebucketResult is what Rebucket changed.
type RebucketResult struct {
	LeaseRowsDeleted int64
	LeaseRowsCreated int
	RowsMoved        int64
}

// UnplaceableRowError is returned by Rebucket with rehash when a row has no
// key and no partition and its message id is not a UUID: its bucket under
// the new count cannot be computed. Nothing changed.
type UnplaceableRowError struct {
	ID  int64
	Err error
}

func (e *UnplaceableRowError) Error() string {
	return fmt.Sprintf("gormstore: row %d has no key or partition, and its message id is not a UUID: its bucket cannot be computed: %v", e.ID, e.Err)
}

func (e *UnplaceableRowError) Unwrap() error { return e.Err }

// Rebucket changes the bucket count to `to` in one transaction: it locks
// the lease rows (SQLite's transaction holds the write lock), reads the
// state again and calls check with it (an error from check rolls back and
// is returned as is), replaces the lease rows with `to` free ones and, with
// rehash, moves every row to the bucket outbox.BucketOf gives it under the
// new count, in id order. Each statement is bounded by
// Options.StatementTimeout, the transaction is not. The store's own
// Config.BucketCount is not changed: deploy writers and relays with the
// new count afterwards.
func (s *Store) Rebucket(ctx context.Context, to int, rehash bool, check func(*RebucketState) error) (*RebucketResult, error) {
	if to < 1 || to > outbox.MaxBucketCount {
		return nil, fmt.Errorf("gormstore: Rebucket to %d buckets: must be between 1 and %d", to, outbox.MaxBucketCount)
	}
	k, err := s.kind(ctx)
	if err != nil {
		return nil, err
	}
	res := &RebucketResult{}
	err = s.primary(ctx, s.leases).Transaction(func(tx *gorm.DB) error {
		step := func(f func(q *gorm.DB) error) error {
			sctx, cancel := context.WithTimeout(ctx, s.timeout)
			defer cancel()
			return f(tx.WithContext(sctx))
		}
		if k != kindSQLite {
			if err := step(func(q *gorm.DB) error {
				var locked []int64
				return q.Table(s.leases).Clauses(clause.Locking{Strength: "UPDATE"}).Pluck("bucket", &locked).Error
			}); err != nil {
				return fmt.Errorf("gormstore: lock %s: %w", s.leases, err)
			}
		}
		st, err := s.readRebucketState(step)
		if err != nil {
			return err
		}
		if err := check(st); err != nil {
			return err
		}
		if err := step(func(q *gorm.DB) error {
			r := q.Exec("DELETE FROM ?", clause.Table{Name: s.leases})
			res.LeaseRowsDeleted = r.RowsAffected
			return r.Error
		}); err != nil {
			return fmt.Errorf("gormstore: delete the rows of %s: %w", s.leases, err)
		}
		for start := 0; start < to; start += rebucketBatch {
			rows := make([]map[string]any, 0, min(rebucketBatch, to-start))
			for b := start; b < min(start+rebucketBatch, to); b++ {
				rows = append(rows, map[string]any{"bucket": b, "owner": nil, "expires_at_ms": 0})
			}
			if err := step(func(q *gorm.DB) error { return q.Table(s.leases).Create(rows).Error }); err != nil {
				return fmt.Errorf("gormstore: create %d lease rows in %s: %w", to, s.leases, err)
			}
		}
		res.LeaseRowsCreated = to
		if rehash && st.Pending+st.Parked > 0 {
			if res.RowsMoved, err = s.rehash(step, to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// rehash moves every row to the bucket n gives it, rebucketBatch rows a
// statement of the caller's transaction, and returns how many moved.
func (s *Store) rehash(step func(func(*gorm.DB) error) error, n int) (int64, error) {
	var moved int64
	after := int64(0)
	for {
		var batch []RowPlacement
		if err := step(func(q *gorm.DB) error {
			rows, err := q.Table(s.msgs).Select("id, bucket, record_key, record_partition, message_id").
				Where("id > ?", after).Order("id").Limit(rebucketBatch).Rows()
			if err != nil {
				return err
			}
			defer rows.Close()
			batch, err = scanPlacements(rows)
			return err
		}); err != nil {
			return 0, fmt.Errorf("gormstore: read the rows of %s: %w", s.msgs, err)
		}
		if len(batch) == 0 {
			return moved, nil
		}
		after = batch[len(batch)-1].ID
		next := map[int32][]int64{} // new bucket → ids moving there
		for _, r := range batch {
			if r.Key == nil && r.Partition == nil && r.IDErr != nil {
				return 0, &UnplaceableRowError{ID: r.ID, Err: r.IDErr}
			}
			if b := outbox.BucketOf(r.Key, r.Partition, r.MessageID, n); int(b) != r.Bucket {
				next[b] = append(next[b], r.ID)
			}
		}
		for b, ids := range next {
			if err := step(func(q *gorm.DB) error {
				r := q.Table(s.msgs).Where("id IN ?", ids).Update("bucket", b)
				moved += r.RowsAffected
				return r.Error
			}); err != nil {
				return 0, fmt.Errorf("gormstore: move %d rows of %s to bucket %d: %w", len(ids), s.msgs, b, err)
			}
		}
	}
}
