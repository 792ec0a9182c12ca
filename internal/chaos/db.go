package chaos

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for the admin connection
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
)

// Dialects.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
)

// Application names of the harness's connections (PostgreSQL), so that a
// connection kill can pick the relays' sessions.
const (
	relayAppName   = "outbox-chaos-relay"
	harnessAppName = "outbox-chaos-harness"
)

// Database is a fresh database created for one run and dropped by Drop.
type Database struct {
	// Dialect is sqlite, postgres or mysql.
	Dialect string
	// DSN opens the database.
	DSN string

	name  string
	admin *sql.DB // server-level connection (nil on SQLite)
}

func unique(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// CreateDatabase creates an empty database on the server of base (a
// PostgreSQL or MySQL DSN), or a SQLite file in dir, and migrates the outbox
// tables plus the lease audit trigger.
func CreateDatabase(ctx context.Context, dialect, base, dir string) (*Database, error) {
	d := &Database{Dialect: dialect, name: unique("outbox_chaos_")}
	var err error
	switch dialect {
	case SQLite:
		d.DSN = "file:" + filepath.Join(dir, d.name+".db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	case Postgres:
		if d.admin, err = sql.Open("pgx", base); err != nil {
			return nil, fmt.Errorf("chaos: open postgres: %w", err)
		}
		if _, err = d.admin.ExecContext(ctx, "CREATE DATABASE "+d.name); err != nil {
			d.admin.Close()
			return nil, fmt.Errorf("chaos: create database: %w", err)
		}
		d.DSN = withPostgresParam(base, "dbname", d.name)
	case MySQL:
		c, err := mysqldrv.ParseDSN(base)
		if err != nil {
			return nil, fmt.Errorf("chaos: parse mysql dsn: %w", err)
		}
		ac := c.Clone()
		ac.DBName = ""
		if d.admin, err = sql.Open("mysql", ac.FormatDSN()); err != nil {
			return nil, fmt.Errorf("chaos: open mysql: %w", err)
		}
		if _, err = d.admin.ExecContext(ctx, "CREATE DATABASE "+d.name); err != nil {
			d.admin.Close()
			return nil, fmt.Errorf("chaos: create database: %w", err)
		}
		c.DBName, c.ParseTime, c.Loc = d.name, true, time.UTC
		d.DSN = c.FormatDSN()
	default:
		return nil, fmt.Errorf("chaos: unknown dialect %q", dialect)
	}
	db, err := Open(dialect, d.DSN, harnessAppName, 2)
	if err != nil {
		d.Drop(ctx)
		return nil, err
	}
	defer closeGorm(db)
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		d.Drop(ctx)
		return nil, err
	}
	for _, s := range auditDDL(dialect) {
		if err := db.Exec(s).Error; err != nil {
			d.Drop(ctx)
			return nil, fmt.Errorf("chaos: audit trigger: %w", err)
		}
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

// KillConnections terminates the relays' database sessions (PostgreSQL:
// pg_terminate_backend of the relay application name; MySQL: KILL
// CONNECTION of every session on the database but the admin one). SQLite
// has no connections to kill.
func (d *Database) KillConnections(ctx context.Context) (int, error) {
	switch d.Dialect {
	case Postgres:
		var n int
		err := d.admin.QueryRowContext(ctx, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2", d.name, relayAppName).Scan(&n)
		return n, err
	case MySQL:
		rows, err := d.admin.QueryContext(ctx, "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()", d.name)
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err == nil {
				ids = append(ids, id)
			}
		}
		rows.Close()
		n := 0
		for _, id := range ids {
			if _, err := d.admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
				n++
			}
		}
		return n, nil
	}
	return 0, errors.New("chaos: sqlite has no connections to kill")
}

// Drop drops the database (PostgreSQL, MySQL) and closes the admin
// connection. The SQLite file goes with its directory.
func (d *Database) Drop(ctx context.Context) {
	if d.admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	switch d.Dialect {
	case Postgres:
		_, _ = d.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
	case MySQL:
		_, _ = d.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+d.name)
	}
	d.admin.Close()
}

// Open opens dsn with a silent logger and at most maxConns connections;
// app names the PostgreSQL session.
func Open(dialect, dsn, app string, maxConns int) (*gorm.DB, error) {
	var dl gorm.Dialector
	switch dialect {
	case SQLite:
		dl = sqlite.Open(dsn)
	case Postgres:
		dl = postgres.Open(withPostgresParam(dsn, "application_name", app))
	case MySQL:
		dl = mysql.Open(dsn)
	default:
		return nil, fmt.Errorf("chaos: unknown dialect %q", dialect)
	}
	db, err := gorm.Open(dl, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
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

// withPostgresParam sets a parameter of a key=value or URL DSN.
func withPostgresParam(dsn, key, value string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			if key == "dbname" {
				u.Path = "/" + value
			} else {
				q := u.Query()
				q.Set(key, value)
				u.RawQuery = q.Encode()
			}
			return u.String()
		}
	}
	return dsn + " " + key + "=" + value
}
