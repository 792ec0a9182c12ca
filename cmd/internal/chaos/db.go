package chaos

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for the admin connection
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Dialects.
const (
	SQLite   = testenv.SQLite
	Postgres = testenv.Postgres
	MySQL    = testenv.MySQL
)

// Application names of the harness's connections (PostgreSQL), so that a
// connection kill can pick the relays' or the consumers' sessions.
const (
	relayAppName    = "outbox-chaos-relay"
	consumerAppName = "outbox-chaos-consumer"
	harnessAppName  = "outbox-chaos-harness"
)

// Database is a fresh database created for one run and dropped by Drop.
type Database struct {
	// Dialect is sqlite, postgres or mysql.
	Dialect string
	// DSN opens the database.
	DSN string
	// RelayDSN opens the database as the relays (of a consumer database:
	// the consumers): DSN, except on MySQL, where they connect as a user
	// of their own, so that a database kill can tell their sessions from
	// the writers' and the harness's (PostgreSQL: by application name).
	RelayDSN string

	name   string
	drop   func()
	admin  *sql.DB // server-level connection (nil on SQLite)
	locker *sql.DB // KillClientSessions' lock connections (opened on first use)
	// The clients KillClientSessions kills: the relays of an outbox
	// database, the consumers of a consumer database.
	clientUser string   // MySQL: their user (see RelayDSN)
	clientApp  string   // PostgreSQL: their application name
	lockTables []string // the tables only they use
}

// CreateDatabase creates an empty database on the server of base (a
// PostgreSQL or MySQL DSN), or a SQLite file in dir, and migrates the outbox
// tables plus the lease audit trigger.
func CreateDatabase(ctx context.Context, dialect, base, dir string) (*Database, error) {
	cfg := outbox.Config{}.WithDefaults()
	d, err := createDatabase(ctx, dialect, base, dir, "outbox_chaos_", "relay_", relayAppName, []string{cfg.LeasesTableName(), cfg.RelaysTableName()})
	if err != nil {
		return nil, err
	}
	err = d.migrate(func(db *gorm.DB) error {
		if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
			return err
		}
		for _, s := range auditDDL(dialect) {
			if err := db.Exec(s).Error; err != nil {
				return fmt.Errorf("chaos: audit trigger: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// migrate runs f on a connection of the harness, dropping d on an error.
func (d *Database) migrate(f func(db *gorm.DB) error) error {
	db, err := Open(d.Dialect, d.DSN, harnessAppName, 2)
	if err == nil {
		err = f(db)
		closeGorm(db)
	}
	if err != nil {
		d.Drop(context.Background())
	}
	return err
}

// createDatabase creates an empty database named with prefix; on MySQL also
// a user (named with userPrefix) for the clients that KillClientSessions
// targets, whose DSN is RelayDSN. app names those clients' PostgreSQL
// sessions, lockTables the tables only they use.
func createDatabase(ctx context.Context, dialect, base, dir, prefix, userPrefix, app string, lockTables []string) (*Database, error) {
	d := &Database{Dialect: dialect, name: testenv.Unique(prefix), clientApp: app, lockTables: lockTables, drop: func() {}}
	switch dialect {
	case SQLite:
		d.DSN = testenv.SQLiteDSN(filepath.Join(dir, d.name+".db"))
	case Postgres, MySQL:
		driver, adminDSN, err := testenv.AdminDSN(dialect, base)
		if err != nil {
			return nil, err
		}
		if d.DSN, d.drop, err = testenv.CreateDatabase(ctx, dialect, base, d.name); err != nil {
			return nil, err
		}
		if d.admin, err = sql.Open(driver, adminDSN); err != nil {
			d.drop()
			return nil, err
		}
	default:
		return nil, fmt.Errorf("chaos: unknown dialect %q", dialect)
	}
	d.RelayDSN = d.DSN
	if dialect == MySQL {
		d.clientUser = userPrefix + strings.TrimPrefix(d.name, prefix)
		for _, q := range []string{
			"CREATE USER '" + d.clientUser + "'@'%'",
			"GRANT ALL PRIVILEGES ON " + d.name + ".* TO '" + d.clientUser + "'@'%'",
		} {
			if _, err := d.admin.ExecContext(ctx, q); err != nil {
				d.Drop(ctx)
				return nil, fmt.Errorf("chaos: create the clients' user: %w", err)
			}
		}
		c, _ := mysqldrv.ParseDSN(d.DSN)
		c.User, c.Passwd = d.clientUser, ""
		d.RelayDSN = c.FormatDSN()
	}
	return d, nil
}

// auditDDL records every change of a lease's owner with the database's
// clock, so that a takeover of a still-valid lease (two live owners) shows
// up: a claim is legal only when old expiry <= the claimer's now <= at_ms.
func auditDDL(dialect string) []string {
	table := "CREATE TABLE chaos_lease_audit (bucket INT, old_owner VARCHAR(128), new_owner VARCHAR(128), old_exp BIGINT, new_exp BIGINT, at_ms BIGINT)"
	switch dialect {
	case Postgres:
		return []string{table,
			`CREATE FUNCTION chaos_lease_audit() RETURNS trigger AS $$ BEGIN
  IF NEW.owner IS DISTINCT FROM OLD.owner THEN
    INSERT INTO chaos_lease_audit VALUES (NEW.bucket, OLD.owner, NEW.owner, OLD.expires_at_ms, NEW.expires_at_ms, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql`,
			"CREATE TRIGGER chaos_lease_audit BEFORE UPDATE ON outbox_leases FOR EACH ROW EXECUTE FUNCTION chaos_lease_audit()",
		}
	case MySQL:
		return []string{table,
			`CREATE TRIGGER chaos_lease_audit BEFORE UPDATE ON outbox_leases FOR EACH ROW BEGIN
  IF NOT (NEW.owner <=> OLD.owner) THEN
    INSERT INTO chaos_lease_audit VALUES (NEW.bucket, OLD.owner, NEW.owner, OLD.expires_at_ms, NEW.expires_at_ms, FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000));
  END IF;
END`,
		}
	default:
		return []string{table,
			`CREATE TRIGGER chaos_lease_audit AFTER UPDATE OF owner ON outbox_leases WHEN NEW.owner IS NOT OLD.owner BEGIN
  INSERT INTO chaos_lease_audit VALUES (NEW.bucket, OLD.owner, NEW.owner, OLD.expires_at_ms, NEW.expires_at_ms, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER));
END`,
		}
	}
}

// DualOwners counts lease takeovers of a bucket whose previous owner's lease
// was still valid, and the owner changes audited.
func DualOwners(db *gorm.DB) (violations, changes int64, err error) {
	if err = db.Raw("SELECT COUNT(*) FROM chaos_lease_audit WHERE old_owner IS NOT NULL AND new_owner IS NOT NULL AND old_owner <> new_owner AND old_exp > at_ms").Scan(&violations).Error; err != nil {
		return 0, 0, err
	}
	err = db.Raw("SELECT COUNT(*) FROM chaos_lease_audit").Scan(&changes).Error
	return violations, changes, err
}

// DBKill is the outcome of one database-kill fault (KillClientSessions).
type DBKill struct {
	// At is when the fault began; Took how long it lasted (the lock held,
	// the kills).
	At   time.Time
	Took time.Duration
	// Locked reports that the harness held the lease tables' lock;
	// Blocked is the number of relay statements seen waiting on it, Waited
	// how long it took to see them (at most dbKillHold).
	Locked  bool
	Blocked int
	Waited  time.Duration
	// Killed counts the relays' sessions terminated; MidStatement those of
	// them that were running a statement (blocked on the harness's lock).
	Killed, MidStatement int
}

// Lock hold of a database-kill fault: at most this long waiting for a
// relay statement to block on the harness's lock. Well under the lease
// (3s): a relay renews every second, so one of three blocks within ~0.3s.
const dbKillHold = 1500 * time.Millisecond

// KillClientSessions terminates the database sessions of the relays (of a
// consumer database: the consumers) while at least one of them is in the
// middle of a statement. Killing idle pooled connections alone does nothing
// a client notices (both drivers check a pooled connection before reusing
// it), and the relays' statements are short: so the harness first locks the
// tables only the clients use (writers never touch them), waits up to
// dbKillHold until a client's statement blocks on the lock, kills every
// session of the clients (PostgreSQL by application name, MySQL by user)
// and releases the lock. SQLite has no sessions to kill.
func (d *Database) KillClientSessions(ctx context.Context) (k DBKill, err error) {
	k.At = time.Now()
	defer func() { k.Took = time.Since(k.At) }()
	if d.Dialect == SQLite {
		return k, errors.New("chaos: sqlite has no sessions to kill")
	}
	release, err := d.lockClientTables(ctx)
	if err == nil {
		k.Locked = true
		defer release()
		t0 := time.Now()
		for end := t0.Add(dbKillHold); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
			if n, err := d.blockedClientSessions(ctx); err == nil && n > 0 {
				k.Blocked = n
				break
			}
		}
		k.Waited = time.Since(t0)
	}
	// Without the lock (it timed out behind a long statement) the kill
	// goes on: MidStatement tells whether it hit a statement.
	switch d.Dialect {
	case Postgres:
		err = d.admin.QueryRowContext(ctx, `SELECT COUNT(*) FILTER (WHERE state = 'active'), COUNT(pg_terminate_backend(pid))
FROM pg_stat_activity WHERE datname = $1 AND application_name = $2`, d.name, d.clientApp).Scan(&k.MidStatement, &k.Killed)
		return k, err
	case MySQL:
		rows, err := d.admin.QueryContext(ctx, "SELECT id, command <> 'Sleep' FROM information_schema.processlist WHERE user = ? AND id <> CONNECTION_ID()", d.clientUser)
		if err != nil {
			return k, err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var active bool
			if rows.Scan(&id, &active) != nil {
				continue
			}
			if _, err := d.admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
				k.Killed++
				if active {
					k.MidStatement++
				}
			}
		}
		return k, nil
	}
	return k, fmt.Errorf("chaos: unknown dialect %q", d.Dialect)
}

// lockClientTables takes the exclusive lock of KillClientSessions on a
// connection of its own (waiting at most 2s for it) and returns its release.
func (d *Database) lockClientTables(ctx context.Context) (release func(), err error) {
	if d.locker == nil {
		driver, dsn := "pgx", testenv.WithPostgresParam(d.DSN, "application_name", harnessAppName)
		if d.Dialect == MySQL {
			driver, dsn = "mysql", d.DSN
		}
		if d.locker, err = sql.Open(driver, dsn); err != nil {
			return nil, err
		}
	}
	conn, err := d.locker.Conn(ctx)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (func(), error) {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // discard the connection
		conn.Close()
		return nil, err
	}
	switch d.Dialect {
	case Postgres:
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fail(err)
		}
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			tx.Rollback()
			return fail(err)
		}
		if _, err := tx.ExecContext(ctx, "LOCK TABLE "+strings.Join(d.lockTables, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			tx.Rollback()
			return fail(err)
		}
		return func() { tx.Rollback(); conn.Close() }, nil
	default:
		if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 2"); err != nil {
			return fail(err)
		}
		if _, err := conn.ExecContext(ctx, "LOCK TABLES "+strings.Join(d.lockTables, " WRITE, ")+" WRITE"); err != nil {
			return fail(err)
		}
		return func() {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), "UNLOCK TABLES"); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
			conn.Close()
		}, nil
	}
}

// blockedClientSessions counts the clients' sessions waiting for a lock.
func (d *Database) blockedClientSessions(ctx context.Context) (int, error) {
	var n int
	var err error
	switch d.Dialect {
	case Postgres:
		err = d.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 AND state = 'active' AND wait_event_type = 'Lock'", d.name, d.clientApp).Scan(&n)
	case MySQL:
		err = d.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE user = ? AND command <> 'Sleep' AND state LIKE 'Waiting for table%lock'", d.clientUser).Scan(&n)
	}
	return n, err
}

// Drop drops the database (PostgreSQL, MySQL) and closes the admin
// connection. The SQLite file goes with its directory.
func (d *Database) Drop(ctx context.Context) {
	if d.locker != nil {
		d.locker.Close()
	}
	d.drop()
	if d.admin == nil {
		return
	}
	if d.clientUser != "" {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = d.admin.ExecContext(ctx, "DROP USER IF EXISTS '"+d.clientUser+"'@'%'")
	}
	d.admin.Close()
}

// Open opens dsn with a silent logger and at most maxConns connections;
// app names the PostgreSQL session.
func Open(dialect, dsn, app string, maxConns int) (*gorm.DB, error) {
	if dialect == Postgres {
		dsn = testenv.WithPostgresParam(dsn, "application_name", app)
	}
	db, err := gorm.Open(testenv.Dialector(dialect, dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		return nil, fmt.Errorf("chaos: open %s: %w", dialect, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	return db, nil
}

func closeGorm(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		_ = s.Close()
	}
}
