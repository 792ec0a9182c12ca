package gormstore

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The hot path
//
// nextBatch and MarkPublished run once per batch of every owned bucket:
// their statements, built once from GORM's dialect, table name and bind
// variables, go straight to database/sql, scanned without reflection into
// a per-batch arena, each DELETE in autocommit without GORM's default
// transaction. Each statement is still shown to the *gorm.DB's logger.

// hotSQL are the statement texts of the hot path, built by the dialector.
type hotSQL struct {
	// nextBatch's bind variables are nextBatchBuckets times the bucket,
	// then the limit.
	nextBatch        string
	nextBatchBuckets int
	// nextBatchExcluding (PostgreSQL) leaves out a request's Exclude, with
	// two more bind variables: the largest id left out, the ids as a
	// bigint[] literal. Elsewhere the ids are written out (excludingLiteral).
	nextBatchExcluding string
	// nextBatchWith renders nextBatch for one bucket (the four expressions
	// of its bucket bind variables), a limit and a condition appended to
	// its WHERE ("" or " AND …"); nextBatchArgs and nextBatchLimit are
	// nextBatch's own.
	nextBatchWith  func(bucket [4]string, limit, cond string) string
	nextBatchArgs  [4]string
	nextBatchLimit string
	// bucketEquality says a bucket is selected by "bucket = ?", not by
	// "bucket >= ? AND bucket <= ?": SQLite sorts the whole bucket for the
	// range form, PostgreSQL needs it (see nextBatch).
	bucketEquality bool
	// skipScan says BucketsWithPending walks the index with a recursive
	// CTE first (not on MySQL or MariaDB, where each step is a range scan).
	skipScan bool
	// order is the ORDER BY of one bucket's unparked rows: the index's
	// order, or "id" on MySQL and MariaDB, which sort the whole bucket
	// otherwise.
	order string
	// tid says nextBatch's statement also reads each row's ctid
	// (PostgreSQL, after batchColumns).
	tid bool
	// del are MarkPublished's statements for the rows of one bucket, its
	// first bind variable.
	del deleteSQL
	// binds[i] is the bind variable of the statement's argument i+1.
	binds []string

	// The statements of several buckets (NextBatches, MarkPublished):
	// see buildMultiSQL.
	multi multiSQL
}

// buildHotSQL renders the hot path's statements with db's dialector.
func buildHotSQL(db *gorm.DB, msgs string) hotSQL {
	stmt := &gorm.Statement{DB: db, Clauses: map[string]clause.Clause{}}
	table := stmt.Quote(clause.Table{Name: msgs})
	h := hotSQL{binds: make([]string, maxIDsPerDelete+1)}
	for i := range h.binds {
		var w strings.Builder
		stmt.Vars = make([]any, i+1)
		db.Dialector.BindVarTo(&w, stmt, nil)
		h.binds[i] = w.String()
	}
	h.bucketEquality = db.Dialector.Name() != "postgres"
	h.skipScan = db.Dialector.Name() != "mysql"
	h.order = "bucket, parked_at_ms, id"
	if db.Dialector.Name() == "mysql" {
		h.order = "id"
	}
	// held: the bucket has no parked row (run once per statement), or no
	// parked row of the row's key with a smaller id holds it. Both name the
	// bucket by a bind variable, not m.bucket: MariaDB then reads only the
	// bucket's parked index entries.
	held := func(guard, corr string) string {
		return " AND (NOT EXISTS (SELECT 1 FROM " + table + " WHERE bucket = " + guard + " AND parked_at_ms IS NOT NULL)" +
			" OR NOT EXISTS (SELECT 1 FROM " + table + " p WHERE p.bucket = " + corr + " AND p.parked_at_ms IS NOT NULL" +
			" AND p.id < m.id AND p.record_key = m.record_key AND " + notCorrupt("p") + "))"
	}
	h.tid = db.Dialector.Name() == "postgres"
	cols := batchColumns
	if h.tid {
		cols += ", ctid::text"
	}
	h.nextBatchWith = func(b [4]string, limit, cond string) string {
		if h.bucketEquality {
			return "SELECT " + cols + " FROM " + table + " m" +
				" WHERE bucket = " + b[0] + " AND parked_at_ms IS NULL" + held(b[2], b[3]) + cond +
				" ORDER BY " + h.order + " LIMIT " + limit
		}
		return "SELECT " + cols + " FROM " + table + " m" +
			" WHERE bucket >= " + b[0] + " AND bucket <= " + b[1] + " AND parked_at_ms IS NULL" + held(b[2], b[3]) + cond +
			" ORDER BY bucket, parked_at_ms, id LIMIT " + limit
	}
	if h.bucketEquality {
		h.nextBatchBuckets = 3
		h.nextBatchArgs, h.nextBatchLimit = [4]string{h.binds[0], "", h.binds[1], h.binds[2]}, h.binds[3]
	} else {
		// The limit is a scalar subquery so that the planner never knows
		// it: knowing it, on statistics that undercount the bucket, it
		// prefers a bitmap scan of the whole bucket and a top-N sort to the
		// in-order index scan that stops early.
		h.nextBatchBuckets = 4
		h.nextBatchArgs, h.nextBatchLimit = [4]string{h.binds[0], h.binds[1], h.binds[2], h.binds[3]}, "(SELECT "+h.binds[4]+"::int)"
		h.nextBatchExcluding = h.nextBatchWith(h.nextBatchArgs, h.nextBatchLimit, excludingCond(h.binds[5], notInArray(h.binds[6])))
	}
	h.nextBatch = h.nextBatchWith(h.nextBatchArgs, h.nextBatchLimit, "")
	buildMultiSQL(&h, db.Dialector.Name(), table)
	del := "DELETE FROM " + table + " WHERE bucket = " + h.binds[0] + " AND parked_at_ms IS NULL AND id "
	switch db.Dialector.Name() {
	case "postgres":
		// Each id looked up in the primary key: the guard's "+ 0" keeps the
		// planner off the (bucket, parked_at_ms, id) index, which it walks
		// whole on statistics that predate a backlog.
		h.del.ids = "DELETE FROM " + table + " WHERE id = ANY(" + h.binds[1] + "::bigint[]) AND bucket + 0 = " + h.binds[0] + " AND parked_at_ms + 0 IS NULL"
		h.del.tids = deleteByLocation(table, h.binds[1], h.binds[2], " AND bucket + 0 = "+h.binds[0]+" AND parked_at_ms + 0 IS NULL")
	case "mysql":
		// MySQL and MariaDB: the multi-table form takes FORCE INDEX (the
		// single-table DELETE does not, MariaDB 10.11), so each id is a
		// primary-key lookup that locks only the listed, committed rows.
		// Other plans lock gaps and writers' uncommitted rows at REPEATABLE
		// READ, and deadlocked writers' commits.
		h.del.prefix = "DELETE m FROM " + table + " m FORCE INDEX (PRIMARY) WHERE m.bucket = " + h.binds[0] +
			" AND m.parked_at_ms IS NULL AND m.id IN ("
		return h
	}
	h.del.prefix = del + "IN ("
	return h
}

// deleteSQL are MarkPublished's DELETE statements. ids, with the ids as a
// bigint[] literal, and tids, by location (see locations.go) with a tid[]
// and a bigint[] literal, are PostgreSQL's; elsewhere prefix is the
// statement up to its IN list, the ids' bind variables to follow, then ")".
type deleteSQL struct{ ids, tids, prefix string }

// deleteByLocation is PostgreSQL's DELETE by location: tids and ids are
// the bind variables of the rows' ctids and ids, in the same order, guard
// further conditions (" AND …"). Each ctid is a TID lookup kept only if its
// row holds the id listed with it and passes guard; OFFSET 0 keeps the
// LATERAL lookups from becoming a join and "+ 0" the conditions off the
// indexes, so the plan does not depend on statistics. The conditions are
// checked again on a row's latest version: a row parked meanwhile stays.
func deleteByLocation(table, tids, ids, guard string) string {
	return "DELETE FROM " + table + " WHERE ctid = ANY(ARRAY(SELECT f.ctid FROM unnest(" + tids + "::tid[], " + ids + "::bigint[]) AS x(tid, id)" +
		" CROSS JOIN LATERAL (SELECT m.ctid FROM " + table + " m WHERE m.ctid = x.tid AND m.id + 0 = x.id" + guard + " OFFSET 0) f))" + guard
}

// excludingCond leaves out a relay.BatchRequest's Exclude: after is the
// largest id left out, notIn holds for the rows not listed. The rows after
// it, the usual answer, pass on the first comparison.
func excludingCond(after, notIn string) string {
	return " AND (m.id > " + after + " OR " + notIn + ")"
}

// notInArray is excludingCond's notIn on PostgreSQL, the ids an array.
func notInArray(ids string) string { return "m.id <> ALL(" + ids + "::bigint[])" }

// excluded returns the ids of rows (ascending) and the largest.
func excluded(rows []*outbox.Message) (ids []int64, last int64) {
	ids = make([]int64, len(rows))
	for i, m := range rows {
		ids[i] = m.ID
	}
	slices.Sort(ids)
	return ids, ids[len(ids)-1]
}

// excludingLiteral is excludingCond for rows (at least one) with the ids
// written out (MySQL, MariaDB, SQLite): no bind variable per id.
func excludingLiteral(rows []*outbox.Message) string {
	ids, last := excluded(rows)
	list := idsArray(ids) // "{1,2,3}"
	return excludingCond(strconv.FormatInt(last, 10), "m.id NOT IN ("+list[1:len(list)-1]+")")
}

// queryRows runs query on q's connection within q's context.
func queryRows(q *gorm.DB, query string, args ...any) (*sql.Rows, error) {
	return q.Statement.ConnPool.QueryContext(q.Statement.Context, query, args...)
}

// trace shows a statement run outside GORM to q's logger.
func trace(q *gorm.DB, begin time.Time, query string, args []any, rows int64, err error) {
	if q.Logger == nil {
		return
	}
	q.Logger.Trace(q.Statement.Context, begin, func() (string, int64) {
		return q.Dialector.Explain(query, args...), rows
	}, err)
}

// arenaChunk is the size of the blocks keys and values are copied into.
const arenaChunk = 32 << 10

// arena hands out slices of shared blocks: one allocation for many rows'
// keys and values.
type arena struct{ buf []byte }

// reserve makes room for n bytes, in a new block sized for rows more such
// rows (at most arenaChunk) when the current one is full.
func (a *arena) reserve(n, rows int) {
	if n <= arenaChunk/4 && cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, min(arenaChunk, n*max(rows, 1)))
	}
}

// clone returns a copy of b, nil for nil.
func (a *arena) clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	n := len(b)
	if n == 0 {
		return []byte{} // empty, not nil: a nil Value is a tombstone
	}
	if n > arenaChunk/4 || cap(a.buf)-len(a.buf) < n {
		return append(make([]byte, 0, n), b...)
	}
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	return a.buf[start : start+n : start+n]
}

// intCol scans an integer column without reflection: the driver's int64,
// or its text (MySQL's text protocol).
type intCol struct {
	v     int64
	valid bool
}

func (c *intCol) Scan(src any) error {
	c.valid = true
	switch x := src.(type) {
	case int64:
		c.v = x
	case int32:
		c.v = int64(x)
	case int:
		c.v = int64(x)
	case []byte:
		return c.parse(x)
	case string:
		return c.parse([]byte(x))
	case nil:
		c.v, c.valid = 0, false
	default:
		return fmt.Errorf("integer column: unexpected %T", src)
	}
	return nil
}

func (c *intCol) parse(b []byte) error {
	var n int64
	neg := len(b) > 0 && b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	if len(digits) == 0 || len(digits) > 19 {
		return fmt.Errorf("integer column: %q", b)
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return fmt.Errorf("integer column: %q", b)
		}
		n = n*10 + int64(d-'0')
	}
	if neg {
		n = -n
	}
	c.v = n
	return nil
}

// uuidCol decodes message_id; a value that is not a UUID is kept as the
// row's decoding error (a corrupt row, not a failed read).
type uuidCol struct {
	v   outbox.UUID
	err error
}

func (c *uuidCol) Scan(src any) error {
	c.err = nil
	var u uuid.UUID
	var err error
	switch x := src.(type) {
	case string:
		u, err = uuid.Parse(x)
	case []byte:
		u, err = uuid.ParseBytes(x)
	case nil:
		c.err = errors.New("message_id is NULL")
		return nil
	default:
		c.err = fmt.Errorf("message_id: unexpected %T", src)
		return nil
	}
	if err != nil {
		c.err = fmt.Errorf("outbox: parse message id %q: %w", textOf(src), err)
		return nil
	}
	c.v = outbox.UUID(u)
	return nil
}

// timeCol decodes created_at; an unparsable value is kept as the row's
// decoding error.
type timeCol struct {
	v   time.Time
	err error
}

func (c *timeCol) Scan(src any) error {
	c.err = nil
	if t, ok := src.(time.Time); ok {
		c.v = t.UTC()
		return nil
	}
	c.v, c.err = parseTime(src)
	if c.err != nil {
		c.err = fmt.Errorf("created_at: %w", c.err)
	}
	return nil
}

// batchScanner scans nextBatch's rows into Messages.
type batchScanner struct {
	id, bucket, partition intCol
	messageID             uuidCol
	createdAt             timeCol
	tid                   tidCol
	withTID               bool // the rows end with their ctid
	topic                 sql.RawBytes
	key, value, headers   sql.RawBytes
	dest                  []any // for database/sql's rows
	pgxDest               []any // for pgx's: the byte columns without a copy

	lastTopic string
	arena     arena
	block     []outbox.Message
}

// newBatchScanner scans batchColumns, then, with tid, the row's ctid.
func newBatchScanner(tid bool) *batchScanner {
	s := &batchScanner{}
	s.dest = []any{&s.id, &s.messageID, &s.bucket, &s.topic, &s.key, &s.value, &s.headers, &s.partition, &s.createdAt}
	s.pgxDest = []any{&s.id, &s.messageID, &s.bucket, rawCol{&s.topic}, rawCol{&s.key}, rawCol{&s.value}, rawCol{&s.headers}, &s.partition, &s.createdAt}
	if tid {
		s.dest, s.withTID = append(s.dest, &s.tid), true
		s.pgxDest = append(s.pgxDest, &s.tid)
	}
	return s
}

// rawCol scans a column of pgx's rows as database/sql scans a
// sql.RawBytes: the driver's bytes, valid until the next row.
type rawCol struct{ p *sql.RawBytes }

func (c rawCol) ScanBytes(b []byte) error {
	*c.p = b
	return nil
}

// message decodes the current row, copying its key and value once. left is
// how many more rows the batch may hold.
func (s *batchScanner) message(left int) (*outbox.Message, error) {
	if s.messageID.err != nil {
		return nil, s.messageID.err
	}
	h, err := outbox.DecodeHeaders(s.headers)
	if err != nil {
		return nil, err
	}
	if s.createdAt.err != nil {
		return nil, s.createdAt.err
	}
	if string(s.topic) != s.lastTopic {
		s.lastTopic = string(s.topic)
	}
	if len(s.block) == 0 {
		s.block = make([]outbox.Message, max(1, min(left, 64)))
	}
	s.arena.reserve(len(s.key)+len(s.value), left)
	m := &s.block[0]
	s.block = s.block[1:]
	*m = outbox.Message{
		ID: s.id.v, MessageID: s.messageID.v, Bucket: int32(s.bucket.v), Topic: s.lastTopic,
		Key: s.arena.clone(s.key), Value: s.arena.clone(s.value), Headers: h, CreatedAt: s.createdAt.v,
	}
	if s.partition.valid {
		p := int32(s.partition.v)
		m.Partition = &p
	}
	return m, nil
}

// idsArray is ids as a PostgreSQL bigint[] literal, {1,2,3}: text cast in
// the statement works with every driver and query mode.
func idsArray(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	b = append(b, '}')
	return string(b)
}
