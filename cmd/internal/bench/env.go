package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
)

// env is the database and broker of one harness run: a fresh database
// (dropped by close) and a broker (an in-process kfake cluster, or the
// brokers named by Config.Brokers: a real one, or kfake in a process of its
// own).
type env struct {
	cfg     Config
	dialect string // gorm dialect name
	dsn     string // DSN of the fresh database
	drop    func()
	tmp     string // SQLite directory
	brokers []string
	fake    *kfake.Cluster
	version string // database server version
}

func unique(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newEnv creates the fresh database and starts or names the broker.
func newEnv(ctx context.Context, cfg Config) (*env, error) {
	e := &env{cfg: cfg}
	switch cfg.DB {
	case "sqlite":
		e.dialect = "sqlite"
		dir, err := os.MkdirTemp("", "outbox-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: sqlite temp dir: %w", err)
		}
		e.tmp = dir
		e.dsn = "file:" + filepath.Join(dir, "bench.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate&_foreign_keys=1"
		e.drop = func() { _ = os.RemoveAll(dir) }
	case "postgres":
		e.dialect = "postgres"
		if err := e.createPostgres(ctx); err != nil {
			return nil, err
		}
	case "mysql":
		e.dialect = "mysql"
		if err := e.createMySQL(ctx); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("bench: unknown database %q (want sqlite, postgres or mysql)", cfg.DB)
	}
	switch cfg.Broker {
	case "kfake":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(cfg.Partitions))
		if err != nil {
			e.close()
			return nil, fmt.Errorf("bench: start kfake: %w", err)
		}
		e.fake = c
		e.brokers = c.ListenAddrs()
	case "real", "kfake-process":
		if len(cfg.Brokers) == 0 {
			e.close()
			return nil, fmt.Errorf("bench: broker %s needs Config.Brokers", cfg.Broker)
		}
		e.brokers = cfg.Brokers
	default:
		e.close()
		return nil, fmt.Errorf("bench: unknown broker %q (want kfake, kfake-process or real)", cfg.Broker)
	}
	db, err := e.open(nil)
	if err != nil {
		e.close()
		return nil, err
	}
	defer closeDB(db)
	q := map[string]string{"sqlite": "SELECT sqlite_version()", "postgres": "SHOW server_version", "mysql": "SELECT VERSION()"}[e.dialect]
	_ = db.Raw(q).Scan(&e.version).Error
	if err := outbox.AutoMigrate(db, outbox.Config{BucketCount: cfg.Buckets}); err != nil {
		e.close()
		return nil, fmt.Errorf("bench: migrate: %w", err)
	}
	return e, nil
}

func (e *env) createPostgres(ctx context.Context) error {
	if e.cfg.DSN == "" {
		return errors.New("bench: database postgres needs a DSN")
	}
	name := unique("outbox_bench_")
	admin, err := sql.Open("pgx", e.cfg.DSN)
	if err != nil {
		return fmt.Errorf("bench: open postgres: %w", err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("bench: create postgres database: %w", err)
	}
	e.dsn = withPostgresDB(e.cfg.DSN, name)
	base := e.cfg.DSN
	e.drop = func() {
		a, err := sql.Open("pgx", base)
		if err != nil {
			return
		}
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = a.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	}
	return nil
}

func withPostgresDB(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return dsn + " dbname=" + name
}

func (e *env) createMySQL(ctx context.Context) error {
	if e.cfg.DSN == "" {
		return errors.New("bench: database mysql needs a DSN")
	}
	c, err := mysqldrv.ParseDSN(e.cfg.DSN)
	if err != nil {
		return fmt.Errorf("bench: parse mysql DSN: %w", err)
	}
	name := unique("outbox_bench_")
	adminCfg := c.Clone()
	adminCfg.DBName = ""
	admin, err := sql.Open("mysql", adminCfg.FormatDSN())
	if err != nil {
		return fmt.Errorf("bench: open mysql: %w", err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("bench: create mysql database: %w", err)
	}
	dbCfg := c.Clone()
	dbCfg.DBName = name
	dbCfg.ParseTime = true
	dbCfg.Loc = time.UTC
	e.dsn = dbCfg.FormatDSN()
	e.drop = func() {
		a, err := sql.Open("mysql", adminCfg.FormatDSN())
		if err != nil {
			return
		}
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = a.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
	}
	return nil
}

// open opens a new *gorm.DB (its own connection pool) on the run's
// database, with plugin registered when non-nil.
func (e *env) open(plugin *outbox.Plugin) (*gorm.DB, error) {
	var d gorm.Dialector
	switch e.dialect {
	case "sqlite":
		d = sqlite.Open(e.dsn)
	case "postgres":
		d = postgres.Open(e.dsn)
	default:
		d = mysql.Open(e.dsn)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", e.dialect, err)
	}
	if e.cfg.MaxIdleConns > 0 {
		if s, err := db.DB(); err == nil {
			s.SetMaxIdleConns(e.cfg.MaxIdleConns)
		}
	}
	if plugin != nil {
		if err := db.Use(*plugin); err != nil {
			closeDB(db)
			return nil, fmt.Errorf("bench: register plugin: %w", err)
		}
	}
	return db, nil
}

func closeDB(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		_ = s.Close()
	}
}

func (e *env) close() {
	if e.fake != nil {
		e.fake.Close()
	}
	if e.drop != nil {
		e.drop()
	}
}

// reset empties the three outbox tables, then ends the database's write-ahead
// log cycle (checkpointStatement), so that every contender of a run starts
// its preload and its drain in a fresh one.
func (e *env) reset(db *gorm.DB) error {
	for _, t := range []string{outbox.DefaultMessagesTable, outbox.DefaultLeasesTable, outbox.DefaultRelaysTable} {
		stmt := "TRUNCATE TABLE " + t
		if e.dialect == "sqlite" {
			stmt = "DELETE FROM " + t
		}
		if err := db.Exec(stmt).Error; err != nil {
			return fmt.Errorf("bench: empty %s: %w", t, err)
		}
	}
	if stmt := checkpointStatement(e.dialect); stmt != "" {
		if err := db.Exec(stmt).Error; err != nil {
			return fmt.Errorf("bench: %s: %w", stmt, err)
		}
	}
	return nil
}

// checkpointStatement is the statement that starts a fresh write-ahead log
// cycle on dialect, "" where there is none to take (MySQL and MariaDB:
// InnoDB checkpoints continuously and writes no full-page images).
//
// On PostgreSQL a checkpoint starts every max_wal_size / (1 +
// checkpoint_completion_target) of log (~540 MB at the services' 1 GB),
// and the first change of each page after one logs the whole page: a
// 200,000-row drain's deletes then write 226 MB of log (27,600 page
// images) instead of 11 MB. Left to the log's volume, the checkpoint fell
// on whichever contender's preload crossed the mark, the first relay's
// after the raw loop's: its deletes paid the page images the raw loop's
// escaped, and its database CPU per message was twice the loop's (8.2 µs
// against 3.9, pg_stat_statements). A CHECKPOINT before each preload puts
// every contender's rows and deletes in one cycle (a preload and a drain
// of 200,000 1 KiB rows log ~300 MB). It needs superuser or, from
// PostgreSQL 15, the pg_checkpoint role.
func checkpointStatement(dialect string) string {
	switch dialect {
	case "postgres":
		return "CHECKPOINT"
	case "sqlite":
		return "PRAGMA wal_checkpoint(TRUNCATE)"
	}
	return ""
}

// createTopic creates a fresh topic with cfg.Partitions partitions and waits
// until every partition has a leader.
func (e *env) createTopic(ctx context.Context, prefix string) (string, error) {
	topic := unique(prefix)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := &kafka.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", e.brokers[0])
	if err != nil {
		return "", fmt.Errorf("bench: dial %s: %w", e.brokers[0], err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return "", fmt.Errorf("bench: find controller: %w", err)
	}
	cc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return "", fmt.Errorf("bench: dial controller: %w", err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: e.cfg.Partitions, ReplicationFactor: 1}); err != nil {
		return "", fmt.Errorf("bench: create topic %s: %w", topic, err)
	}
	for {
		ps, err := conn.ReadPartitions(topic)
		if err == nil && len(ps) == e.cfg.Partitions {
			ready := true
			for _, p := range ps {
				if p.Leader.Host == "" {
					ready = false
				}
			}
			if ready {
				return topic, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("bench: topic %s has no leaders (last error %v): %w", topic, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deleteTopic removes a topic after its scenario, best effort, so that a
// long run does not fill the broker's disk.
func (e *env) deleteTopic(topic string) {
	conn, err := kafka.Dial("tcp", e.brokers[0])
	if err != nil {
		return
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return
	}
	defer cc.Close()
	_ = cc.DeleteTopics(topic)
}
