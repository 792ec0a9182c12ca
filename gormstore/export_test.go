package gormstore

import (
	"context"
	"strings"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// NextBatchWithoutHolds runs NextBatch's statement as the release before
// issue 27 had it (no hold condition; on MySQL and MariaDB the range form
// and the index's ORDER BY), for benchmarks comparing the two in one run.
func NextBatchWithoutHolds(ctx context.Context, s *Store, bucket, limit int) ([]*outbox.Message, error) {
	table := s.hot.nextBatch[strings.Index(s.hot.nextBatch, " FROM ")+len(" FROM ") : strings.Index(s.hot.nextBatch, " m WHERE")]
	b := s.hot.binds
	query := "SELECT " + batchColumns + " FROM " + table +
		" WHERE bucket >= " + b[0] + " AND bucket <= " + b[1] + " AND parked_at_ms IS NULL" +
		" ORDER BY bucket, parked_at_ms, id LIMIT " + b[2]
	args := []any{bucket, bucket, limit}
	if s.db.Dialector.Name() == "sqlite" {
		query = "SELECT " + batchColumns + " FROM " + table +
			" WHERE bucket = " + b[0] + " AND parked_at_ms IS NULL" +
			" ORDER BY bucket, parked_at_ms, id LIMIT " + b[1]
		args = []any{bucket, limit}
	}
	var msgs []*outbox.Message
	err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		rows, err := queryRows(q, s.rawPrefix()+query, args...)
		if err != nil {
			return err
		}
		c, err := scanBatch(rows, limit, 0, false)
		if err == nil {
			msgs = c.msgs
		}
		return err
	})
	return msgs, err
}

// NextBatchSQL returns NextBatch's statement text with its bind variables.
func NextBatchSQL(s *Store) string { return s.hot.nextBatch }

// DeleteStatement returns MarkPublished's statement for ids of bucket and
// its arguments.
func DeleteStatement(s *Store, bucket int, ids []int64) (string, []any) {
	return s.deleteStatement(bucket, ids)
}

// NextBatchesSQL returns PostgreSQL's NextBatches statement text with its
// bind variables ("" elsewhere).
func NextBatchesSQL(s *Store) string { return s.hot.multi.nextBatches }

// DeleteBucketsStatement returns MarkPublishedBuckets' statement for ids and
// its arguments.
func DeleteBucketsStatement(s *Store, ids []int64) (string, []any) {
	return s.deleteBucketsStatement(ids)
}

// DeleteByLocationSQL returns MarkPublished's and MarkPublishedBuckets'
// statements by location, with their bind variables (PostgreSQL; ""
// elsewhere).
func DeleteByLocationSQL(s *Store) (bucket, buckets string) {
	return s.hot.deleteTIDs, s.hot.multi.deleteTIDs
}
