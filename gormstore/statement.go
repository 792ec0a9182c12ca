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
// Options.StatementTimeout is zero: well under the relay's default lease
// renewal interval, so a renewal that times out leaves time for the next.
const DefaultStatementTimeout = 5 * time.Second

// Settings a read/write-splitting resolver reads: resolverWrite (the key
// dbresolver.Write stores) sends a statement to the primary.
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

// primary returns s.db on ctx with every statement marked for the primary.
// When a resolver is registered, its source pool is resolved at once, so
// that a transaction begun on the session runs on the primary too; table
// is for per-table resolvers.
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

// writeTx runs fn as one read-write transaction on the primary at READ
// COMMITTED (a plain transaction on SQLite), bounded as a whole by the
// statement timeout. A deadlock victim changed nothing and is retried, up
// to deadlockAttempts runs in all.
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

// read runs fn, reads only, on the primary at READ COMMITTED or stronger,
// bounded by the statement timeout: directly on PostgreSQL and SQLite,
// else in one READ ONLY transaction.
func (s *Store) read(ctx context.Context, table string, fn func(q *gorm.DB) error) error {
	return s.run(ctx, table, modeRead, fn)
}

// fetchGuard turns bitmap scans off for the rest of a PostgreSQL fetch's
// transaction: on statistics that say the table is empty while it holds a
// backlog, the planner would read and sort the whole bucket every batch.
const fetchGuard = "SELECT set_config('enable_bitmapscan', 'off', true)"

// rowScanner is database/sql's rows or pgx's (a pipelined fetch), scanning
// a row into a batchScanner's columns.
type rowScanner interface {
	Next() bool
	Err() error
	scanInto(sc *batchScanner) error
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) scanInto(sc *batchScanner) error { return r.Scan(sc.dest...) }

type pgxRows struct{ pgx.Rows }

func (r pgxRows) scanInto(sc *batchScanner) error { return r.Scan(sc.pgxDest...) }

// fetch runs one of the hot path's fetches, as read does, and hands its
// rows to scan, which returns how many it read. On PostgreSQL it runs after
// fetchGuard in one transaction: one pgx batch on pgx's driver, else BEGIN,
// guard, statement and COMMIT.
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

// fetchPipelined sends fetchGuard and a fetch's statement in one pgx
// batch. A failure or a cancellation leaves nothing on the connection: the
// batch's implicit transaction ends with it, and pgx's driver reports a
// connection it closed or left in a transaction bad to database/sql.
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
// or read transaction; an error from the bound wraps
// context.DeadlineExceeded. On PostgreSQL pgx's cancel request ends the
// statement on the server too. On MariaDB each statement also starts with
// SET STATEMENT max_statement_time (mariaPrefix) and the deadline falls
// later (grace): go-sql-driver closes the connection without a KILL QUERY.
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
// or a lock wait timeout (1205).
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

// mariaPrefix is the SET STATEMENT clause bounding one MariaDB statement;
// its lock waits are whole seconds, at least 1.
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

// mariaBound makes the statement GORM builds, whichever it is, start with
// prefix.
type mariaBound struct{ prefix string }

func (m mariaBound) ModifyStatement(stmt *gorm.Statement) {
	for _, name := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		c := stmt.Clauses[name]
		c.BeforeExpression = clause.Expr{SQL: m.prefix}
		stmt.Clauses[name] = c
	}
}

func (mariaBound) Build(clause.Builder) {}
