package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// The functions below return errors instead of failing a test: the
// benchmark and chaos harnesses (cmd/internal) share them outside tests.

// SQLiteDSN is the DSN of the SQLite file path: WAL and a busy timeout, so
// that several pools and processes can share it.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate&_foreign_keys=1"
}

// Dialector returns the gorm dialector of dialect (Postgres, MySQL or
// SQLite) for dsn.
func Dialector(dialect, dsn string) gorm.Dialector {
	switch dialect {
	case Postgres:
		return postgres.Open(dsn)
	case MySQL:
		return mysql.Open(dsn)
	}
	return sqlite.Open(dsn)
}

// WithPostgresParam sets key of a key=value or URL PostgreSQL DSN; key
// "dbname" names the database.
func WithPostgresParam(dsn, key, value string) string {
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

// AdminDSN returns the database/sql driver and the DSN of a server-level
// connection to the server of base (a PostgreSQL or MySQL DSN).
func AdminDSN(dialect, base string) (driver, dsn string, err error) {
	if dialect == Postgres {
		return "pgx", base, nil
	}
	c, err := mysqldrv.ParseDSN(base)
	if err != nil {
		return "", "", fmt.Errorf("testenv: parse mysql DSN: %w", err)
	}
	c.DBName = ""
	return "mysql", c.FormatDSN(), nil
}

// adminExec runs stmt on a server-level connection of its own.
func adminExec(ctx context.Context, dialect, base, stmt string) error {
	driver, dsn, err := AdminDSN(dialect, base)
	if err != nil {
		return err
	}
	admin, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = admin.ExecContext(ctx, stmt)
	return err
}

// CreateDatabase creates database name on the server of base (a
// PostgreSQL or MySQL DSN) and returns its DSN (MySQL: parseTime, UTC) and
// drop, which drops it (PostgreSQL WITH (FORCE): its sessions end).
func CreateDatabase(ctx context.Context, dialect, base, name string) (dsn string, drop func(), err error) {
	if err := adminExec(ctx, dialect, base, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("testenv: create %s database: %w", dialect, err)
	}
	stmt := "DROP DATABASE IF EXISTS " + name
	if dialect == Postgres {
		dsn, stmt = WithPostgresParam(base, "dbname", name), stmt+" WITH (FORCE)"
	} else {
		c, _ := mysqldrv.ParseDSN(base) // parsed by adminExec
		c.DBName, c.ParseTime, c.Loc = name, true, time.UTC
		dsn = c.FormatDSN()
	}
	return dsn, func() { _ = adminExec(context.WithoutCancel(ctx), dialect, base, stmt) }, nil
}

// CreateTopic creates tc's topic through d (nil: plaintext, 10 s dial
// timeout) and waits until every partition has a leader that answers and
// tc.ReplicationFactor replicas in sync: right after a topic is created a
// leader may still answer "not leader for partition", which a producer
// making one attempt (the relay's publisher) reports as a failure.
func CreateTopic(ctx context.Context, d *kafka.Dialer, addrs []string, tc kafka.TopicConfig) error {
	if d == nil {
		d = &kafka.Dialer{Timeout: 10 * time.Second}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addrs[0])
	if err != nil {
		return fmt.Errorf("testenv: dial %s: %w", addrs[0], err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("testenv: find controller: %w", err)
	}
	cc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return fmt.Errorf("testenv: dial controller: %w", err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(tc); err != nil {
		return fmt.Errorf("testenv: create topic %s: %w", tc.Topic, err)
	}
	for {
		ps, err := conn.ReadPartitions(tc.Topic)
		if err == nil && len(ps) == tc.NumPartitions {
			for _, p := range ps {
				if p.Leader.Host == "" || p.Error != nil || len(p.Isr) < tc.ReplicationFactor {
					err = fmt.Errorf("partition %d: leader %d, %d replicas in sync", p.ID, p.Leader.ID, len(p.Isr))
					break
				}
			}
			if err == nil {
				if err = leadersServe(ctx, d, tc.Topic, ps); err == nil {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: topic %s not ready (last error %v): %w", tc.Topic, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// leadersServe asks every partition's leader for its last offset.
func leadersServe(ctx context.Context, d *kafka.Dialer, topic string, ps []kafka.Partition) error {
	for _, p := range ps {
		lc, err := d.DialLeader(ctx, "tcp", net.JoinHostPort(p.Leader.Host, strconv.Itoa(p.Leader.Port)), topic, p.ID)
		if err != nil {
			return err
		}
		_ = lc.SetDeadline(time.Now().Add(3 * time.Second))
		_, err = lc.ReadLastOffset()
		lc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// ReadPID returns the pid in the first line of file, checking that the
// process runs.
func ReadPID(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("testenv: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("testenv: pid file %s holds no pid (%q)", file, b)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, fmt.Errorf("testenv: process %d (from %s) is not running: %w", pid, file, err)
	}
	return pid, nil
}

// BrokerPID returns the pid of the real broker's JVM from the pid file
// scripts/services.sh writes ($OUTBOX_SERVICES_DIR/kafka/kafka.pid, by
// default under /tmp/gorm-outbox-services).
func BrokerPID() (int, error) {
	dir := os.Getenv("OUTBOX_SERVICES_DIR")
	if dir == "" {
		dir = "/tmp/gorm-outbox-services"
	}
	return ReadPID(dir + "/kafka/kafka.pid")
}
