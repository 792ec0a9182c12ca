package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
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

// skipScanSteps bounds the buckets the skip scan visits for n requested:
// it visits other relays' buckets too.
func skipScanSteps(n int) int { return min(max(n/4, 8), 999) }

// skipScanPending walks the buckets in [buckets[0], last of buckets] that
// hold an unparked row. It returns the requested ones it found, ascending,
// and the highest bucket whose state it knows.
func (s *Store) skipScanPending(ctx context.Context, buckets []int) (found []int, reached int, err error) {
	lo, hi := buckets[0], buckets[len(buckets)-1]
	steps := skipScanSteps(len(buckets))
	t := clause.Table{Name: s.msgs}
	query := "WITH RECURSIVE nb(bucket, n) AS (" +
		"SELECT (SELECT bucket FROM ? WHERE bucket >= ? AND bucket <= ? AND parked_at_ms IS NULL ORDER BY bucket LIMIT 1), 1" +
		" UNION ALL SELECT (SELECT bucket FROM ? WHERE bucket > nb.bucket AND bucket <= ? AND parked_at_ms IS NULL ORDER BY bucket LIMIT 1), n + 1" +
		" FROM nb WHERE nb.bucket IS NOT NULL AND n < ?)" +
		" SELECT bucket, n FROM nb WHERE bucket IS NOT NULL"
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		found, reached = []int{}, hi
		rows, err := q.Raw(s.rawPrefix()+query, t, lo, hi, t, hi, steps).Rows()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b, n int
			if err := rows.Scan(&b, &n); err != nil {
				return err
			}
			if n == steps {
				reached = b // stopped here: the buckets above are unknown
			}
			if _, ok := slices.BinarySearch(buckets, b); ok {
				found = append(found, b)
			}
		}
		return rows.Err()
	}); err != nil {
		return nil, 0, fmt.Errorf("gormstore: walk pending buckets: %w", err)
	}
	return found, reached, nil
}

// maxIDsPerDelete bounds the ids of one MarkPublished DELETE.
const maxIDsPerDelete = 1000

// BucketsWithPending implements relay.Store. On PostgreSQL and SQLite a
// skip scan of the (bucket, parked_at_ms, id) index (skipScanPending) costs
// an idle table one lookup whatever the bucket count; the buckets beyond it
// (all on MySQL and MariaDB, where each step would be a range scan) are
// probed with nextBatch's query at LIMIT 1, 1000 a statement. Not EXISTS:
// PostgreSQL drops the ORDER BY of an EXISTS subquery and may scan the heap
// past every dead or parked row.
func (s *Store) BucketsWithPending(ctx context.Context, buckets []int) ([]int, error) {
	buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
	if len(buckets) == 0 {
		return []int{}, nil
	}
	out, reached := []int{}, buckets[0]-1
	if s.hot.skipScan {
		var err error
		if out, reached, err = s.skipScanPending(ctx, buckets); err != nil {
			return nil, err
		}
	}
	buckets = buckets[sort.SearchInts(buckets, reached+1):] // beyond the walk
	for len(buckets) > 0 {
		chunk := buckets[:min(len(buckets), maxExistsPerStatement)]
		buckets = buckets[len(chunk):]
		if s.db.Dialector.Name() == "postgres" {
			found, err := s.probeHeads(ctx, chunk)
			if err != nil {
				return nil, err
			}
			out = append(out, found...)
			continue
		}
		vals, err := s.probeEach(ctx, "SELECT id FROM ? WHERE bucket = ? AND parked_at_ms IS NULL ORDER BY "+s.hot.order+" LIMIT 1", 1, chunk)
		if err != nil {
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

// probeHeads returns the buckets (ascending) holding an unparked row, on
// PostgreSQL, by LATERAL head probes: scalar subqueries would be planned
// anew at every execution.
func (s *Store) probeHeads(ctx context.Context, buckets []int) ([]int, error) {
	ids := make([]int64, len(buckets))
	for i, b := range buckets {
		ids[i] = int64(b)
	}
	t := clause.Table{Name: s.msgs}
	var found []int
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		found = found[:0]
		return q.Raw(s.rawPrefix()+"SELECT g.b FROM unnest(?::int[]) AS g(b) CROSS JOIN LATERAL"+
			" (SELECT id FROM ? WHERE bucket >= g.b AND bucket <= g.b AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT 1) h"+
			" ORDER BY g.b", idsArray(ids), t).Scan(&found).Error
	}); err != nil {
		return nil, fmt.Errorf("gormstore: probe pending buckets: %w", err)
	}
	return found, nil
}

// nextBatch answers a request of one bucket: its oldest unparked rows that
// no parked row of their key holds, scanned by hand (see "The hot path").
// A row it cannot decode ends the batch with a *relay.CorruptRowError, the
// rows before it returned too. On PostgreSQL the bucket is a range ordered
// as the index, walked from its head without a sort: with "bucket = ?
// ORDER BY id" the planner often walks the primary key instead.
func (s *Store) nextBatch(ctx context.Context, req relay.BatchRequest) (relay.BatchResult, error) {
	bucket, limit, maxBytes := req.Buckets[0], req.Limit, req.MaxBytes
	query := s.hot.nextBatch
	args := make([]any, 0, s.hot.nextBatchBuckets+3)
	for range s.hot.nextBatchBuckets {
		args = append(args, bucket)
	}
	args = append(args, limit)
	switch {
	case len(req.Exclude) == 0:
	case s.hot.nextBatchExcluding != "":
		ids, last := excluded(req.Exclude)
		query, args = s.hot.nextBatchExcluding, append(args, last, idsArray(ids))
	default:
		query = s.hot.nextBatchWith(s.hot.nextBatchArgs, s.hot.nextBatchLimit, excludingLiteral(req.Exclude))
	}
	var c *batchCut
	if err := s.fetch(ctx, query, args, func(rows rowScanner) (n int64, err error) {
		c, err = scanBatch(rows, limit, maxBytes, s.hot.tid)
		if err != nil {
			return 0, err
		}
		return int64(len(c.msgs)), nil
	}); err != nil {
		return relay.BatchResult{}, fmt.Errorf("gormstore: bucket %d: next batch: %w", bucket, err)
	}
	s.locs.put(c.msgs, c.tids)
	return c.result(), nil
}

// scanBatch reads nextBatch's rows into a batch (see batchCut).
func scanBatch(rows rowScanner, limit int, maxBytes int64, tid bool) (*batchCut, error) {
	sc := newBatchScanner(tid)
	c := newBatchCut(limit, maxBytes)
	for !c.done && rows.Next() {
		if err := rows.scanInto(sc); err != nil {
			return nil, err
		}
		c.add(sc)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// batchCut is one bucket's batch as its rows are scanned, oldest first: at
// most limit rows and, with maxBytes > 0, up to the row whose
// relay.MessageSize brings the total beyond it, that row included.
type batchCut struct {
	limit    int
	maxBytes int64
	total    int64
	msgs     []*outbox.Message
	tids     []int64 // tids[i] is msgs[i]'s ctid, when the rows end with it
	corrupt  *relay.CorruptRowError
	done     bool // the batch takes no more rows
}

func newBatchCut(limit int, maxBytes int64) *batchCut {
	return &batchCut{limit: limit, maxBytes: maxBytes, msgs: make([]*outbox.Message, 0, min(limit, 64)), done: limit <= 0}
}

// add decodes sc's current row into the batch, unless the batch is done.
func (c *batchCut) add(sc *batchScanner) {
	if c.done {
		return
	}
	m, err := sc.message(c.limit - len(c.msgs))
	if err != nil {
		c.corrupt = &relay.CorruptRowError{ID: sc.id.v, Bucket: int(sc.bucket.v), Err: err}
		c.done = true
		return
	}
	c.msgs = append(c.msgs, m)
	if sc.withTID {
		c.tids = append(c.tids, sc.tid.v)
	}
	c.done = len(c.msgs) >= c.limit
	if c.maxBytes > 0 {
		// The row crossing the bound is included: the relay tells a batch
		// cut by size from a drained bucket by it.
		if c.total += relay.MessageSize(m); c.total > c.maxBytes {
			c.done = true
		}
	}
}

// result is the batch as a relay.BatchResult.
func (c *batchCut) result() relay.BatchResult {
	if c.corrupt != nil {
		return relay.BatchResult{Rows: c.msgs, Err: c.corrupt}
	}
	return relay.BatchResult{Rows: c.msgs}
}

// batchColumns are the columns nextBatch reads, in batchScanner's order.
const batchColumns = "id, message_id, bucket, topic, record_key, record_value, headers, record_partition, created_at"

// MarkPublished implements relay.Store: it deletes exactly the given rows,
// unless parked (a row parked after it was read is published again once
// requeued, never lost), each statement in autocommit. Each id is one
// probe of the primary key (on SQLite, of the (bucket, parked_at_ms, id)
// index with all three columns bound), so the cost does not grow with the
// bucket's rows, live or dead. Rows of one bucket are deleted by
// statements naming it (hotSQL.del); rows of several by statements that
// name none, their ids ascending (multiSQL.del), on SQLite one statement
// per id in one transaction (deleteEach). On PostgreSQL a row this Store
// read is deleted by location first (locations.go).
func (s *Store) MarkPublished(ctx context.Context, published []*outbox.Message) error {
	if len(published) == 0 {
		return nil
	}
	ids := make([]int64, len(published))
	for i, m := range published {
		ids[i] = m.ID
	}
	bucket := int(published[0].Bucket)
	if !slices.ContainsFunc(published, func(m *outbox.Message) bool { return int(m.Bucket) != bucket }) {
		return s.deleteRows(ctx, ids, s.hot.del, []any{bucket}, func(chunk []int64, err error) error {
			return fmt.Errorf("gormstore: bucket %d: mark %d published: %w", bucket, len(chunk), err)
		})
	}
	slices.Sort(ids)
	if s.hot.multi.deleteOne != "" {
		return s.deleteEach(ctx, ids)
	}
	return s.deleteRows(ctx, ids, s.hot.multi.del, nil, func(chunk []int64, err error) error {
		return fmt.Errorf("gormstore: mark %d published (ids %d to %d): %w", len(chunk), chunk[0], chunk[len(chunk)-1], err)
	})
}

// deleteRows deletes ids with d's statements, their bind variables after
// head's, in chunks: maxIDsPerArray ids per statement by array, else
// maxIDsPerDelete. A chunk whose rows' locations the store knows is
// deleted by location, then by id only when that deleted fewer rows than
// it lists. wrap gives a failed chunk's error its context.
func (s *Store) deleteRows(ctx context.Context, ids []int64, d deleteSQL, head []any, wrap func([]int64, error) error) error {
	s.watchPoolSoon(ctx)
	per := maxIDsPerDelete
	if d.ids != "" {
		per = maxIDsPerArray
	}
	var tids []int64
	if s.hot.tid {
		tids = s.locs.take(ids)
	}
	for off := 0; off < len(ids); off += per {
		end := min(len(ids), off+per)
		chunk := ids[off:end]
		if tids != nil {
			n, err := s.execDelete(ctx, d.tids, append(slices.Clip(head), tidsArray(tids[off:end]), idsArray(chunk)))
			if err != nil {
				return wrap(chunk, err)
			}
			if n == int64(len(chunk)) {
				continue
			}
		}
		query, args := d.ids, append(slices.Clip(head), idsArray(chunk))
		if d.ids == "" {
			query, args = s.inList(d.prefix, head, chunk)
		}
		if _, err := s.execDelete(ctx, query, args); err != nil {
			return wrap(chunk, err)
		}
	}
	return nil
}

// execDelete runs one DELETE and returns the rows it deleted (-1 unknown).
func (s *Store) execDelete(ctx context.Context, query string, args []any) (int64, error) {
	var n int64
	err := s.write(ctx, s.msgs, func(q *gorm.DB) error {
		query := s.rawPrefix() + query
		begin := time.Now()
		res, err := q.Statement.ConnPool.ExecContext(q.Statement.Context, query, args...)
		n = -1 // unknown: a delete by location is then repeated by id
		if err == nil {
			if affected, aerr := res.RowsAffected(); aerr == nil {
				n = affected
			}
		}
		trace(q, begin, query, args, n, err)
		return err
	})
	return n, err
}

// maxIDsPerArray bounds the ids of one PostgreSQL MarkPublished DELETE.
const maxIDsPerArray = 10000

// inList completes prefix (ending in "IN (") with a bind variable per id,
// after those of head, and returns the statement and its arguments.
func (s *Store) inList(prefix string, head []any, ids []int64) (string, []any) {
	var b strings.Builder
	b.Grow(len(prefix) + 4*len(ids) + 1)
	b.WriteString(prefix)
	args := make([]any, 0, len(head)+len(ids))
	args = append(args, head...)
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s.hot.binds[len(head)+i])
		args = append(args, id)
	}
	b.WriteByte(')')
	return b.String(), args
}

// pendingExactBelow is the estimated table size under which PendingMetrics
// counts exactly.
const pendingExactBelow = 50_000

// PendingMetrics implements relay.Store; its cost does not grow with the
// backlog. Below pendingExactBelow estimated rows (or with no estimate) it
// is one exact aggregate. Above, Count is the database's live-row estimate
// minus Parked, Oldest the oldest of the buckets' heads, and Parked an
// exact count of the parked index entries. SQLite has no estimate: Count
// and Parked are exact, Oldest comes from the heads once the unparked rows
// reach pendingExactBelow.
func (s *Store) PendingMetrics(ctx context.Context) (*relay.Pending, error) {
	k, err := s.kind(ctx)
	if err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: %w", err)
	}
	est, err := s.rowEstimate(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: row estimate: %w", err)
	}
	if est >= pendingExactBelow {
		p := &relay.Pending{}
		if p.Parked, err = s.countParked(ctx); err != nil {
			return nil, fmt.Errorf("gormstore: pending metrics: parked rows: %w", err)
		}
		p.Count = max(est-p.Parked, 0)
		if p.Oldest, err = s.oldestHead(ctx, k); err != nil {
			return nil, fmt.Errorf("gormstore: pending metrics: bucket heads: %w", err)
		}
		return p, nil
	}
	var count, parked int64
	var oldest any
	exactOldest := "MIN(CASE WHEN parked_at_ms IS NULL THEN created_at END)"
	if k == kindSQLite {
		exactOldest = "NULL"
	}
	if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Table(s.msgs).
			Select("COUNT(*) - COUNT(parked_at_ms), "+exactOldest+", COUNT(parked_at_ms)").
			Row().Scan(&count, &oldest, &parked)
	}); err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: %w", err)
	}
	var t time.Time
	switch {
	case k != kindSQLite:
		t, err = parseTime(oldest)
	case count < pendingExactBelow:
		err = s.read(ctx, s.msgs, func(q *gorm.DB) error {
			return q.Table(s.msgs).Select("MIN(created_at)").Where("parked_at_ms IS NULL").Row().Scan(&oldest)
		})
		if err == nil {
			t, err = parseTime(oldest)
		}
	default:
		t, err = s.oldestHead(ctx, k)
	}
	if err != nil {
		return nil, fmt.Errorf("gormstore: pending metrics: oldest created_at: %w", err)
	}
	return &relay.Pending{Count: count, Oldest: t, Parked: parked}, nil
}

// rowEstimate is the database's estimate of the messages table's live
// rows, or -1 when it has none.
func (s *Store) rowEstimate(ctx context.Context, k int) (int64, error) {
	var query string
	var args []any
	switch k {
	case kindPostgres:
		query = "SELECT COALESCE(pg_stat_get_live_tuples(to_regclass(?)), -1)"
		args = []any{s.db.Statement.Quote(clause.Table{Name: s.msgs})}
	case kindMySQL, kindMariaDB:
		schema, table := "", s.msgs
		if i := strings.LastIndexByte(table, '.'); i >= 0 {
			schema, table = table[:i], table[i+1:]
		}
		query = "SELECT COALESCE((SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?), -1)"
		args = []any{schema, table}
	default:
		return -1, nil
	}
	var est sql.NullInt64
	err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Raw(s.rawPrefix()+query, args...).Row().Scan(&est)
	})
	if err != nil || !est.Valid {
		return -1, err
	}
	return est.Int64, nil
}

// countParked counts the parked index entries, 1000 buckets a statement.
func (s *Store) countParked(ctx context.Context) (int64, error) {
	all, err := s.allBuckets(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, c := range all {
		var n int64
		if err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
			return q.Table(s.msgs).Where("bucket IN ? AND parked_at_ms IS NOT NULL", c).Count(&n).Error
		}); err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// oldestHead is the oldest created_at among the buckets' heads, zero when
// there are none; each head is one index probe.
func (s *Store) oldestHead(ctx context.Context, k int) (time.Time, error) {
	const head = "SELECT created_at FROM ? WHERE bucket >= %s AND bucket <= %s AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT 1"
	if k == kindPostgres {
		var oldest any
		err := s.read(ctx, s.msgs, func(q *gorm.DB) error {
			return q.Raw("SELECT MIN(h.created_at) FROM generate_series(0, ?) AS g(n) CROSS JOIN LATERAL ("+
				fmt.Sprintf(head, "g.n", "g.n")+") h", s.cfg.BucketCount-1, clause.Table{Name: s.msgs}).Row().Scan(&oldest)
		})
		if err != nil {
			return time.Time{}, err
		}
		return parseTime(oldest)
	}
	// MySQL and MariaDB read a bucket's head by equality in id order, as
	// nextBatch does: with the range form MariaDB sorts the whole bucket.
	bucketHead, perBucket := fmt.Sprintf(head, "?", "?"), 2
	if k == kindMySQL || k == kindMariaDB {
		bucketHead, perBucket = "SELECT created_at FROM ? WHERE bucket = ? AND parked_at_ms IS NULL ORDER BY id LIMIT 1", 1
	}
	var oldest time.Time
	for c := range slices.Chunk(s.configuredBuckets(), maxPerStatement) {
		vals, err := s.probeEach(ctx, bucketHead, perBucket, c)
		if err != nil {
			return time.Time{}, err
		}
		for _, v := range vals {
			t, err := parseTime(v)
			if err != nil {
				return time.Time{}, err
			}
			if !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
				oldest = t
			}
		}
	}
	return oldest, nil
}

// probeEach runs one SELECT of the scalar subquery sub for each of
// buckets, sub's arguments the table and perBucket times the bucket, and
// returns their values (nil for NULL).
func (s *Store) probeEach(ctx context.Context, sub string, perBucket int, buckets []int) ([]any, error) {
	var b strings.Builder
	args := make([]any, 0, (1+perBucket)*len(buckets))
	b.WriteString(s.rawPrefix() + "SELECT ")
	for i, bucket := range buckets {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(" + sub + ")")
		args = append(args, clause.Table{Name: s.msgs}, bucket)
		if perBucket == 2 {
			args = append(args, bucket)
		}
	}
	vals := make([]any, len(buckets))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, s.read(ctx, s.msgs, func(q *gorm.DB) error {
		return q.Raw(b.String(), args...).Row().Scan(ptrs...)
	})
}

// timeLayouts are the textual forms a timestamp comes back in.
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
