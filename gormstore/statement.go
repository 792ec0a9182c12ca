package gormstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultStatementTimeout bounds each store statement when
// Options.StatementTimeout is zero. It is well under the relay's default
// LeaseRenewInterval (10s) and LeaseDuration (30s): a renewal that times out
// still leaves time for the next one before the leases expire.
const DefaultStatementTimeout = 5 * time.Second

// Settings a read/write-splitting resolver reads. The store sets
// resolverWrite on every statement: gorm.io/plugin/dbresolver then sends the
// statement to a source (primary), never to a replica. It is the key
// dbresolver.Write stores; the store does not import dbresolver.
const (
	resolverWrite    = "gorm:db_resolver:write"
	resolverCallback = "gorm:db_resolver"
)

// dialect kinds the store treats differently.
const (
	kindOther = iota
	kindPostgres
	kindSQLite
	kindMySQL   // MySQL or a MySQL-compatible server that is not MariaDB
	kindMariaDB // MariaDB: SET STATEMENT … FOR
	kindUnknownMySQL
)

func kindOf(dialect string) int {
	switch dialect {
	case "postgres":
		return kindPostgres
	case "sqlite":
		return kindSQLite
	case "mysql":
		return kindUnknownMySQL
	default:
		return kindOther
	}
}

// primary returns s.db on ctx with every statement marked for the primary
// (resolverWrite). When a resolver is registered, its source pool is
// resolved at once and the returned session starts on it, so that a
// transaction begun on it runs on the primary too (dbresolver never
// switches the statements of a transaction). table names the table the
// statement(s) mainly touch, for per-table resolvers.
func (s *Store) primary(ctx context.Context, table string) *gorm.DB {
	q := s.db.WithContext(ctx).Set(resolverWrite, struct{}{})
	if fc := s.db.Callback().Query().Get(resolverCallback); fc != nil {
		r := s.db.WithContext(ctx).Set(resolverWrite, struct{}{}).Table(table)
		fc(r)
		q.Statement.ConnPool = r.Statement.ConnPool
	}
	return q.Session(&gorm.Session{})
}

// kind returns the store's dialect kind, asking a MySQL-dialect server once
// whether it is MariaDB.
func (s *Store) kind(ctx context.Context) (int, error) {
	s.mu.Lock()
	k := s.dialect
	s.mu.Unlock()
	if k != kindUnknownMySQL {
		return k, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var version string
	if err := s.primary(ctx, s.leases).Raw("SELECT VERSION()").Row().Scan(&version); err != nil {
		return 0, fmt.Errorf("gormstore: server version: %w", err)
	}
	k = kindMySQL
	if strings.Contains(strings.ToLower(version), "mariadb") {
		k = kindMariaDB
	}
	s.mu.Lock()
	s.dialect = k
	s.mu.Unlock()
	return k, nil
}

// readCommitted are the options of the store's read transactions on MySQL
// and MariaDB.
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true}

// writeCommitted are the options of the store's write transactions.
var writeCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// How run runs fn.
type runMode int

const (
	modeWrite   runMode = iota // one autocommit writing statement
	modeRead                   // reads of committed data
	modeWriteTx                // a read-write transaction at READ COMMITTED
)

// write runs fn, one writing statement, on the primary, bounded by the
// statement timeout.
func (s *Store) write(ctx context.Context, table string, fn func(q *gorm.DB) error) error {
	return s.run(ctx, table, modeWrite, fn)
}

// writeTx runs fn, the statements of one read-write transaction, on the
// primary at READ COMMITTED whatever the pool's default isolation (so that
// each statement sees the rows committed before it started, and a locking
// read waits for and then reads the latest committed version), bounded as
// a whole by the statement timeout (on MariaDB each statement also carries
// the SET STATEMENT bound). The transaction commits when fn returns nil and
// rolls back otherwise. On SQLite it is a plain transaction (every SQLite
// transaction is serializable).
//
// A transaction the database ends as a deadlock victim (InnoDB's 1213,
// PostgreSQL's 40P01: a requeue locking a key's parked rows while the
// relay holds new rows behind their head and writers insert) is retried,
// up to deadlockAttempts times in all: it changed nothing.
func (s *Store) writeTx(ctx context.Context, table string, fn func(tx *gorm.DB) error) error {
	var err error
	for range deadlockAttempts {
		if err = s.run(ctx, table, modeWriteTx, fn); err == nil || !deadlocked(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// deadlockAttempts bounds the runs of one writeTx ended by deadlocks.
const deadlockAttempts = 5

// deadlocked reports whether err ended a transaction as a deadlock victim:
// MySQL/MariaDB error 1213, PostgreSQL SQLSTATE 40P01.
func deadlocked(err error) bool {
	m := err.Error()
	return strings.Contains(m, "Error 1213") || strings.Contains(m, "SQLSTATE 40P01")
}

// read runs fn, one or more reads, on the primary at READ COMMITTED or
// stronger whatever the pool's default isolation, bounded by the statement
// timeout: directly where the dialect's autocommit statements already read
// committed data (PostgreSQL, SQLite), else (MySQL, MariaDB) in one READ ONLY
// transaction at READ COMMITTED, which costs three more round trips (SET
// TRANSACTION, START TRANSACTION READ ONLY, COMMIT; see BenchmarkNextBatch).
// fn must not write.
func (s *Store) read(ctx context.Context, table string, fn func(q *gorm.DB) error) error {
	return s.run(ctx, table, modeRead, fn)
}

// fetchGuard is the setting the hot path's fetches (nextBatch,
// NextBatches) run under on PostgreSQL: no bitmap scans, for the rest of
// the fetch's transaction only. Statistics that say the table is empty
// while it holds a backlog (an ANALYZE of the drained table, or one that
// ran while the backlog's transaction was still open; they last until
// autovacuum analyzes the table again) estimate a bucket at one row, and
// the planner then reads every row of the bucket through a bitmap and
// sorts them, for each batch: 200-270 ms against 1-5 ms for 500 of 25,000
// rows, a drain seven times slower.
const fetchGuard = "SELECT set_config('enable_bitmapscan', 'off', true)"

// rowScanner is what the fetches' scans read rows through: database/sql's
// rows or pgx's (a pipelined fetch), each scanning a row into a
// batchScanner's columns.
type rowScanner interface {
	Next() bool
	Err() error
	scanInto(sc *batchScanner) error
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) scanInto(sc *batchScanner) error { return r.Scan(sc.dest...) }

type pgxRows struct{ pgx.Rows }

func (r pgxRows) scanInto(sc *batchScanner) error { return r.Scan(sc.pgxDest...) }

// fetch runs query, one of the hot path's fetches, with args on the
// primary (as read does), and hands its rows to scan, which returns how
// many it read; the statement is shown to the logger. On PostgreSQL the
// statement runs after fetchGuard in one transaction, sent together with
// it: through pgx, one round trip (a batch: the two statements and one
// Sync, which PostgreSQL runs as one implicit transaction), elsewhere (a
// pool that is not a *sql.DB on pgx's driver) BEGIN, the guard, the
// statement and COMMIT, four.
func (s *Store) fetch(ctx context.Context, query string, args []any, scan func(rowScanner) (int64, error)) error {
	k, err := s.kind(ctx)
	if err != nil {
		return err
	}
	return s.read(ctx, s.msgs, func(q *gorm.DB) error {
		query := s.rawPrefix() + query
		if k != kindPostgres {
			return fetchOn(q, query, args, scan)
		}
		if err := fetchPipelined(q, query, args, scan); !errors.Is(err, errNotPGX) {
			return err
		}
		return q.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(fetchGuard).Error; err != nil {
				return err
			}
			return fetchOn(tx, query, args, scan)
		})
	})
}

// fetchOn runs a fetch's statement through database/sql on q's connection.
func fetchOn(q *gorm.DB, query string, args []any, scan func(rowScanner) (int64, error)) error {
	begin := time.Now()
	rows, err := queryRows(q, query, args...)
	var n int64
	if err == nil {
		n, err = scan(sqlRows{rows})
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}
	trace(q, begin, query, args, n, err)
	return err
}

// errNotPGX says fetchPipelined ran nothing: q's pool is not a *sql.DB on
// pgx's database/sql driver.
var errNotPGX = errors.New("gormstore: not a pgx connection")

// fetchPipelined sends fetchGuard and a fetch's statement to PostgreSQL in
// one pgx batch, on a connection of q's pool. A failure or a cancellation
// leaves nothing behind on the connection: the batch's implicit
// transaction ends with it, and a connection pgx closed (a cancelled
// statement) or left in a transaction is never reused (pgx's driver
// reports it bad to database/sql).
func fetchPipelined(q *gorm.DB, query string, args []any, scan func(rowScanner) (int64, error)) error {
	db, ok := q.Statement.ConnPool.(*sql.DB)
	if !ok {
		return errNotPGX
	}
	ctx := q.Statement.Context
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	begin := time.Now()
	var n int64
	err = conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return errNotPGX
		}
		var b pgx.Batch
		b.Queue(fetchGuard)
		b.Queue(query, args...)
		br := pc.Conn().SendBatch(ctx, &b)
		_, err := br.Exec()
		if err == nil {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				n, err = scan(pgxRows{rows})
				rows.Close()
				err = cmp.Or(err, rows.Err())
			}
		}
		return cmp.Or(err, br.Close())
	})
	if errors.Is(err, errNotPGX) {
		return err
	}
	trace(q, begin, fetchGuard, nil, 1, nil)
	trace(q, begin, query, args, n, err)
	return err
}

// run runs fn on the primary within the statement timeout, per statement
// (or per read transaction), never per session. An error from the bound
// wraps context.DeadlineExceeded:
//
//   - PostgreSQL: a context deadline of the timeout. pgx then closes the
//     connection and sends PostgreSQL a cancel request, which ends the
//     statement on the server too (TestAStatementAbandonedByItsContext).
//     Setting statement_timeout and lock_timeout instead would take a
//     transaction around each statement (SET LOCAL): three more round trips.
//   - MariaDB: every statement fn builds is prefixed with SET STATEMENT
//     max_statement_time=…, lock_wait_timeout=…, innodb_lock_wait_timeout=…
//     FOR (no extra round trip), and the context deadline falls a little
//     later (grace), so that MariaDB's error arrives first and the
//     connection stays usable. The deadline alone would not do:
//     go-sql-driver closes the connection without a KILL QUERY, and the
//     statement keeps waiting on the server.
//   - MySQL (not MariaDB; untested), SQLite and others: the context deadline
//     only. On SQLite a write waiting for another writer waits out the
//     connection's busy timeout whatever the context says (mattn/go-sqlite3
//     interrupts a running statement, not its busy handler): set _busy_timeout
//     in the DSN at most StatementTimeout.
func (s *Store) run(ctx context.Context, table string, mode runMode, fn func(q *gorm.DB) error) error {
	k, err := s.kind(ctx)
	if err != nil {
		return err
	}
	d := s.timeout
	if k == kindMariaDB {
		d += grace(s.timeout)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err = s.runOn(ctx, k, table, mode, fn)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || parent.Err() != nil {
		return err
	}
	if ctx.Err() != nil || serverTimeout(err) {
		return fmt.Errorf("%w (StatementTimeout %v: %w)", err, s.timeout, context.DeadlineExceeded)
	}
	return err
}

// serverTimeout reports whether err is MariaDB's max_statement_time (1969)
// or a lock wait timeout (1205): the store's bound, enforced by the server.
func serverTimeout(err error) bool {
	m := err.Error()
	return strings.Contains(m, "Error 1969") || strings.Contains(m, "Error 1205")
}

func (s *Store) runOn(ctx context.Context, k int, table string, mode runMode, fn func(q *gorm.DB) error) error {
	q := s.primary(ctx, table)
	if k == kindMariaDB {
		q = q.Clauses(mariaBound{prefix: s.mariaPrefix()})
	}
	switch {
	case mode == modeWriteTx && k == kindSQLite:
		return q.Transaction(fn)
	case mode == modeWriteTx:
		return q.Transaction(fn, writeCommitted)
	case mode == modeRead && k != kindSQLite && k != kindPostgres:
		return q.Transaction(fn, readCommitted)
	default:
		return fn(q)
	}
}

// grace is how much later than MariaDB's own bound the context deadline
// falls: a fifth of the timeout, at most 1s.
func grace(d time.Duration) time.Duration { return min(d/5, time.Second) }

// mariaPrefix is the SET STATEMENT clause bounding one MariaDB statement.
// The lock waits are whole seconds (at least 1), max_statement_time covers
// every wait to the microsecond.
func (s *Store) mariaPrefix() string {
	secs := int64(math.Ceil(s.timeout.Seconds()))
	return fmt.Sprintf("SET STATEMENT max_statement_time=%.6f, lock_wait_timeout=%d, innodb_lock_wait_timeout=%d FOR",
		s.timeout.Seconds(), max(secs, 1), max(secs, 1))
}

// rawPrefix is what a raw SQL statement of the store starts with: the
// MariaDB bound, or nothing.
func (s *Store) rawPrefix() string {
	s.mu.Lock()
	k := s.dialect
	s.mu.Unlock()
	if k == kindMariaDB {
		return s.mariaPrefix() + " "
	}
	return ""
}

// mariaBound makes the statement GORM builds start with prefix: it sits
// before the first clause of whichever statement is built (SELECT, INSERT,
// UPDATE or DELETE); GORM merges its own clause into it and keeps it.
type mariaBound struct{ prefix string }

func (m mariaBound) ModifyStatement(stmt *gorm.Statement) {
	for _, name := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		c := stmt.Clauses[name]
		c.BeforeExpression = clause.Expr{SQL: m.prefix}
		stmt.Clauses[name] = c
	}
}

func (mariaBound) Build(clause.Builder) {}
