package gormstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// maxBucketsPerStatement bounds the buckets of one NextBatches statement
// (SQLite allows 500 members of a compound SELECT).
const maxBucketsPerStatement = 256

// maxBindsPerStatement bounds the bind variables of one NextBatches
// statement on MySQL, MariaDB and SQLite (SQLite before 3.32 allows 999).
const maxBindsPerStatement = 999

// multiSQL are the statement texts of NextBatches and MarkPublished for
// several buckets (see buildMultiSQL).
type multiSQL struct {
	// nextBatches, with two bind variables (the buckets and the limits as
	// PostgreSQL int[] literals, in the same order), is PostgreSQL's
	// NextBatches statement; "" elsewhere.
	nextBatches string
	// nextBatchesExcluding adds two bind variables: each bucket's largest
	// id left out (the smallest bigint for none) and every id left out.
	nextBatchesExcluding string
	// member is one bucket's part of NextBatches' UNION ALL on MySQL,
	// MariaDB and SQLite, with hotSQL.nextBatch's bind variables, and
	// memberWith renders it with a condition appended to its WHERE; ""
	// for a dialect without either form (nextBatch per bucket).
	member     string
	memberWith func(cond string) string
	// perStatement is how many buckets one NextBatches statement reads.
	perStatement int
	// del are MarkPublished's statements for rows of several buckets.
	del deleteSQL
	// deleteOne (SQLite; "" elsewhere) deletes one id (see deleteEach).
	deleteOne string
	// inOrderWith renders nextInOrder's statement on SQLite from its
	// bucket filter (a condition on inOrderBucket), a condition appended to
	// its WHERE ("" or " AND …") and its limit; nil elsewhere (nextInOrder
	// then merges NextBatches' answers).
	inOrderWith   func(filter, cond, limit string) string
	inOrderBucket string
}

// buildMultiSQL renders h.multi for dialect from h.nextBatchWith, nextBatch's
// statement for one bucket.
func buildMultiSQL(h *hotSQL, dialect, table string) {
	m := &h.multi
	m.perStatement = min(maxBucketsPerStatement, maxBindsPerStatement/(h.nextBatchBuckets+1))
	m.del.prefix = "DELETE FROM " + table + " WHERE parked_at_ms IS NULL AND id IN ("
	switch dialect {
	case "postgres":
		// One LATERAL subquery per (bucket, limit) pair: nextBatch's index
		// scan, run once per pair, stopping at its limit.
		m.perStatement = maxBucketsPerStatement
		m.nextBatches = "SELECT x.* FROM unnest(" + h.binds[0] + "::int[], " + h.binds[1] + "::int[]) AS r(b, n)" +
			" CROSS JOIN LATERAL (" + h.nextBatchWith([4]string{"r.b", "r.b", "r.b", "r.b"}, "r.n", "") + ") x"
		m.nextBatchesExcluding = "SELECT x.* FROM unnest(" + h.binds[0] + "::int[], " + h.binds[1] + "::int[], " + h.binds[2] + "::bigint[]) AS r(b, n, a)" +
			" CROSS JOIN LATERAL (" + h.nextBatchWith([4]string{"r.b", "r.b", "r.b", "r.b"}, "r.n", excludingCond("r.a", notInArray(h.binds[3]))) + ") x"
		// By id, through the primary key ("+ 0" as in MarkPublished's); no
		// bucket guard: an id names one row, whichever bucket holds it.
		m.del.ids = "DELETE FROM " + table + " WHERE id = ANY(" + h.binds[0] + "::bigint[]) AND parked_at_ms + 0 IS NULL"
		m.del.tids = deleteByLocation(table, h.binds[0], h.binds[1], " AND parked_at_ms + 0 IS NULL")
	case "mysql":
		// MariaDB 10.11 has no LATERAL: a UNION ALL of parenthesised
		// selects, each nextBatch's statement. The delete looks each id up
		// in the primary key, as MarkPublished's does (see buildHotSQL).
		m.memberWith = func(cond string) string { return "(" + h.nextBatchWith([4]string{"?", "?", "?", "?"}, "?", cond) + ")" }
		m.del.prefix = "DELETE m FROM " + table + " m FORCE INDEX (PRIMARY) WHERE m.parked_at_ms IS NULL AND m.id IN ("
	case "sqlite":
		// SQLite takes no ORDER BY or LIMIT on a member of a compound
		// SELECT: each member is a subquery. The delete is one statement
		// per id (see deleteEach).
		m.memberWith = func(cond string) string {
			return "SELECT * FROM (" + h.nextBatchWith([4]string{"?", "?", "?", "?"}, "?", cond) + ")"
		}
		m.deleteOne = "DELETE FROM " + table + " WHERE id = ? AND parked_at_ms IS NULL"
	}
	if m.memberWith != nil {
		m.member = m.memberWith("")
	}
	if dialect != "sqlite" {
		return
	}
	// nextInOrder on SQLite: the table in rowid order, the buckets a filter
	// ("+ 0" keeps the planner off the bucket index, which would read the
	// buckets' rows and sort them); the hold in its per-row form only (no
	// index leads with parked_at_ms).
	m.inOrderBucket = "m.bucket + 0"
	m.inOrderWith = func(filter, cond, limit string) string {
		return "SELECT " + batchColumns + " FROM " + table + " m" +
			" WHERE " + filter + " AND m.parked_at_ms IS NULL" +
			" AND NOT EXISTS (SELECT 1 FROM " + table + " p WHERE p.bucket = m.bucket AND p.parked_at_ms IS NOT NULL" +
			" AND p.id < m.id AND p.record_key = m.record_key AND " + notCorrupt("p") + ")" + cond +
			" ORDER BY m.id LIMIT " + limit
	}
}

// NextBatches implements relay.Store. Requests of one bucket are answered
// as nextBatch would, perStatement a statement (a single one is nextBatch's
// own): on PostgreSQL a LATERAL join of unnest(buckets, limits) with
// nextBatch's statement, on MySQL, MariaDB and SQLite a UNION ALL of them,
// each bucket's part keeping nextBatch's plan. The rows are not sorted as a
// whole (a sort of wide rows would spill to disk) but split by bucket.
// A request of several buckets goes to nextInOrder.
func (s *Store) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	results := make([]relay.BatchResult, len(reqs))
	active := make([]int, 0, len(reqs)) // requests of one bucket with rows to read
	seen := make(map[int]bool, len(reqs))
	for i, r := range reqs {
		for _, b := range r.Buckets {
			if seen[b] {
				return nil, fmt.Errorf("gormstore: next batches: bucket %d requested twice", b)
			}
			seen[b] = true
		}
		var err error
		switch {
		case r.Limit <= 0 || len(r.Buckets) == 0:
		case len(r.Buckets) > 1:
			results[i], err = s.nextInOrder(ctx, r)
		default:
			active = append(active, i)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(active) == 1 || s.hot.multi.nextBatches == "" && s.hot.multi.member == "" {
		for _, i := range active {
			var err error
			if results[i], err = s.nextBatch(ctx, reqs[i]); err != nil {
				return nil, err
			}
		}
		return results, nil
	}
	for len(active) > 0 {
		chunk := active[:min(len(active), s.hot.multi.perStatement)]
		active = active[len(chunk):]
		if err := s.nextBatches(ctx, reqs, chunk, results); err != nil {
			return nil, err
		}
	}
	return results, nil
}

// nextBatches answers reqs[i] for each i of idx in one statement, into
// results[i].
func (s *Store) nextBatches(ctx context.Context, reqs []relay.BatchRequest, idx []int, results []relay.BatchResult) error {
	query, args := s.nextBatchesStatement(reqs, idx)
	var cuts map[int64]*batchCut
	if err := s.fetch(ctx, query, args, func(rows rowScanner) (int64, error) {
		cuts = make(map[int64]*batchCut, len(idx))
		for _, i := range idx {
			cuts[int64(reqs[i].Buckets[0])] = newBatchCut(reqs[i].Limit, reqs[i].MaxBytes)
		}
		return scanBatches(rows, cuts, s.hot.tid)
	}); err != nil {
		return fmt.Errorf("gormstore: next batches of %d buckets from bucket %d: %w", len(idx), reqs[idx[0]].Buckets[0], err)
	}
	for _, i := range idx {
		c := cuts[int64(reqs[i].Buckets[0])]
		results[i] = c.result()
		s.locs.put(c.msgs, c.tids)
	}
	return nil
}

// nextBatchesStatement is NextBatches' statement for reqs[i], i in idx.
func (s *Store) nextBatchesStatement(reqs []relay.BatchRequest, idx []int) (string, []any) {
	m := &s.hot.multi
	if m.nextBatches != "" {
		buckets, limits := make([]int64, len(idx)), make([]int64, len(idx))
		afters, ids := make([]int64, len(idx)), []int64(nil)
		for j, i := range idx {
			buckets[j], limits[j], afters[j] = int64(reqs[i].Buckets[0]), int64(reqs[i].Limit), math.MinInt64
			if len(reqs[i].Exclude) > 0 {
				var some []int64
				some, afters[j] = excluded(reqs[i].Exclude)
				ids = append(ids, some...)
			}
		}
		if ids == nil {
			return m.nextBatches, []any{idsArray(buckets), idsArray(limits)}
		}
		return m.nextBatchesExcluding, []any{idsArray(buckets), idsArray(limits), idsArray(afters), idsArray(ids)}
	}
	var b strings.Builder
	b.Grow(len(idx) * (len(m.member) + len(" UNION ALL ")))
	args := make([]any, 0, len(idx)*(s.hot.nextBatchBuckets+1))
	for j, i := range idx {
		if j > 0 {
			b.WriteString(" UNION ALL ")
		}
		if len(reqs[i].Exclude) == 0 {
			b.WriteString(m.member)
		} else {
			b.WriteString(m.memberWith(excludingLiteral(reqs[i].Exclude)))
		}
		for range s.hot.nextBatchBuckets {
			args = append(args, reqs[i].Buckets[0])
		}
		args = append(args, reqs[i].Limit)
	}
	return b.String(), args
}

// scanBatches reads NextBatches' rows into their buckets' batches until
// every batch is done, and returns the rows read. A row of a bucket not
// asked for, or a bucket's rows out of id order, fail it.
func scanBatches(rows rowScanner, cuts map[int64]*batchCut, tid bool) (int64, error) {
	sc := newBatchScanner(tid)
	last := make(map[int64]int64, len(cuts)) // bucket → id of its latest row
	open, n := len(cuts), int64(0)
	for open > 0 && rows.Next() {
		if err := rows.scanInto(sc); err != nil {
			return n, err
		}
		n++
		b, id := sc.bucket.v, sc.id.v
		c := cuts[b]
		if c == nil {
			return n, fmt.Errorf("row %d of bucket %d, which was not asked for", id, b)
		}
		if prev, ok := last[b]; ok && id <= prev {
			return n, fmt.Errorf("bucket %d: row %d after row %d: rows out of id order", b, id, prev)
		}
		last[b] = id
		if !c.done {
			if c.add(sc); c.done {
				open--
			}
		}
	}
	return n, rows.Err()
}

// deleteEach deletes ids with deleteOne, prepared once, in one
// transaction: SQLite's MarkPublished of several buckets. Given statistics
// of a drained table, SQLite's planner reads the whole table for
// "id IN (…)" without a bucket; a rowid lookup per id is its plan whatever
// the statistics say.
func (s *Store) deleteEach(ctx context.Context, ids []int64) error {
	s.watchPoolSoon(ctx)
	err := s.writeTx(ctx, s.msgs, func(tx *gorm.DB) error {
		begin := time.Now()
		stmt, err := tx.Statement.ConnPool.PrepareContext(tx.Statement.Context, s.hot.multi.deleteOne)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, id := range ids {
			if _, err := stmt.ExecContext(tx.Statement.Context, id); err != nil {
				return err
			}
		}
		trace(tx, begin, s.hot.multi.deleteOne, []any{ids[0]}, int64(len(ids)), nil) // one statement shown for all
		return nil
	})
	if err != nil {
		return fmt.Errorf("gormstore: mark %d published (ids %d to %d): %w", len(ids), ids[0], ids[len(ids)-1], err)
	}
	return nil
}

// nextInOrder answers a request of several buckets, which the relay makes
// on SQLite only (relay.Options.SingleWriter): one statement reads the
// table in rowid order from the buckets' first pending row, like a plain
// "ORDER BY id LIMIT n" loop, whatever the bucket count. The buckets are a
// span less its holes, or an IN list when the holes outnumber them; the
// hold is nextBatch's per-row subquery, and the rows are cut as nextBatch
// cuts a batch. Elsewhere it merges NextBatches' answers: one statement
// over the primary key there read every other bucket's rows and the dead
// entries of rows deleted meanwhile.
func (s *Store) nextInOrder(ctx context.Context, req relay.BatchRequest) (relay.BatchResult, error) {
	buckets := req.Buckets // distinct and ascending, as the contract asks; else a sorted copy
	for i := 1; i < len(buckets); i++ {
		if buckets[i] <= buckets[i-1] {
			buckets = slices.Compact(slices.Sorted(slices.Values(buckets)))
			break
		}
	}
	if s.hot.multi.inOrderWith == nil {
		return s.nextInOrderMerged(ctx, req, buckets)
	}
	var c *batchCut
	if err := s.fetch(ctx, s.nextInOrderStatement(buckets, req.Limit, req.Exclude), nil, func(rows rowScanner) (int64, error) {
		c = newBatchCut(req.Limit, req.MaxBytes)
		return scanInOrder(rows, c, buckets, s.hot.tid)
	}); err != nil {
		return relay.BatchResult{}, fmt.Errorf("gormstore: next in order of %d buckets from bucket %d: %w", len(buckets), buckets[0], err)
	}
	s.locs.put(c.msgs, c.tids)
	return c.result(), nil
}

// nextInOrderStatement is nextInOrder's statement for buckets (ascending,
// distinct, at least one), limit and the rows of exclude.
func (s *Store) nextInOrderStatement(buckets []int, limit int, exclude []*outbox.Message) string {
	m := &s.hot.multi
	col := m.inOrderBucket
	lo, hi := buckets[0], buckets[len(buckets)-1]
	literal := func(xs []int64) string {
		a := idsArray(xs) // "{1,2,3}"
		return a[1 : len(a)-1]
	}
	var filter, cond string
	if hi-lo+1-len(buckets) > len(buckets) { // fewer buckets than holes: list the buckets
		ids := make([]int64, len(buckets))
		for i, b := range buckets {
			ids[i] = int64(b)
		}
		filter = col + " IN (" + literal(ids) + ")"
	} else {
		filter = col + " >= " + strconv.Itoa(lo) + " AND " + col + " <= " + strconv.Itoa(hi)
		var holes []int64
		for b := lo; b <= hi; b++ {
			if _, ok := slices.BinarySearch(buckets, b); !ok {
				holes = append(holes, int64(b))
			}
		}
		if len(holes) > 0 {
			filter += " AND " + col + " NOT IN (" + literal(holes) + ")"
		}
	}
	if len(exclude) > 0 {
		cond = excludingLiteral(exclude)
	}
	return m.inOrderWith(filter, cond, strconv.Itoa(limit))
}

// scanInOrder reads nextInOrder's rows into c until it is done, as
// scanBatches does.
func scanInOrder(rows rowScanner, c *batchCut, buckets []int, tid bool) (int64, error) {
	sc := newBatchScanner(tid)
	var n, last int64
	for !c.done && rows.Next() {
		if err := rows.scanInto(sc); err != nil {
			return n, err
		}
		n++
		b, id := sc.bucket.v, sc.id.v
		if _, ok := slices.BinarySearch(buckets, int(b)); !ok {
			return n, fmt.Errorf("row %d of bucket %d, which was not asked for", id, b)
		}
		if n > 1 && id <= last {
			return n, fmt.Errorf("row %d after row %d: rows out of id order", id, last)
		}
		last = id
		c.add(sc)
	}
	return n, rows.Err()
}

// nextInOrderMerged is nextInOrder without its statement: each bucket's
// head, as NextBatches reads it, merged in id order and cut as a batch.
func (s *Store) nextInOrderMerged(ctx context.Context, req relay.BatchRequest, buckets []int) (relay.BatchResult, error) {
	excl := make(map[int64][]*outbox.Message)
	for _, m := range req.Exclude {
		excl[int64(m.Bucket)] = append(excl[int64(m.Bucket)], m)
	}
	reqs := make([]relay.BatchRequest, len(buckets))
	for i, b := range buckets {
		reqs[i] = relay.BatchRequest{Buckets: []int{b}, Limit: req.Limit, Exclude: excl[int64(b)]}
	}
	results, err := s.NextBatches(ctx, reqs)
	if err != nil {
		return relay.BatchResult{}, err
	}
	var all []*outbox.Message
	var corrupt *relay.CorruptRowError
	for _, r := range results {
		all = append(all, r.Rows...)
		var ce *relay.CorruptRowError
		if errors.As(r.Err, &ce) && (corrupt == nil || ce.ID < corrupt.ID) {
			corrupt = ce
		}
	}
	slices.SortFunc(all, func(a, b *outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
	var out relay.BatchResult
	var total int64
	for _, m := range all {
		if len(out.Rows) >= req.Limit || req.MaxBytes > 0 && total > req.MaxBytes {
			return out, nil
		}
		if corrupt != nil && m.ID > corrupt.ID {
			break
		}
		out.Rows = append(out.Rows, m)
		total += relay.MessageSize(m)
	}
	if corrupt != nil && len(out.Rows) < req.Limit && (req.MaxBytes <= 0 || total <= req.MaxBytes) {
		out.Err = corrupt
	}
	return out, nil
}
