package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// env is the database and broker of one harness run: a fresh database
// (dropped by close) and a broker (an in-process kfake cluster, or the
// brokers named by Config.Brokers).
type env struct {
	cfg     Config
	dsn     string // DSN of the fresh database
	drop    func()
	tmp     string // SQLite directory
	brokers []string
	fake    *kfake.Cluster
	version string // database server version
}

// newEnv creates the fresh database and starts or names the broker.
func newEnv(ctx context.Context, cfg Config) (_ *env, err error) {
	e := &env{cfg: cfg, drop: func() {}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	switch cfg.DB {
	case "sqlite":
		dir, err := os.MkdirTemp("", "outbox-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: sqlite temp dir: %w", err)
		}
		e.tmp, e.dsn, e.drop = dir, testenv.SQLiteDSN(filepath.Join(dir, "bench.db")), func() { _ = os.RemoveAll(dir) }
	case "postgres", "mysql":
		if cfg.DSN == "" {
			return nil, fmt.Errorf("bench: database %s needs a DSN", cfg.DB)
		}
		if e.dsn, e.drop, err = testenv.CreateDatabase(ctx, cfg.DB, cfg.DSN, testenv.Unique("outbox_bench_")); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	default:
		return nil, fmt.Errorf("bench: unknown database %q (want sqlite, postgres or mysql)", cfg.DB)
	}
	switch cfg.Broker {
	case "kfake":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(cfg.Partitions))
		if err != nil {
			return nil, fmt.Errorf("bench: start kfake: %w", err)
		}
		e.fake, e.brokers = c, c.ListenAddrs()
	case "real", "kfake-process":
		if len(cfg.Brokers) == 0 {
			return nil, fmt.Errorf("bench: broker %s needs Config.Brokers", cfg.Broker)
		}
		e.brokers = cfg.Brokers
	default:
		return nil, fmt.Errorf("bench: unknown broker %q (want kfake, kfake-process or real)", cfg.Broker)
	}
	db, err := e.open(nil)
	if err != nil {
		return nil, err
	}
	defer closeDB(db)
	q := map[string]string{"sqlite": "SELECT sqlite_version()", "postgres": "SHOW server_version", "mysql": "SELECT VERSION()"}[e.cfg.DB]
	_ = db.Raw(q).Scan(&e.version).Error
	if err = outbox.AutoMigrate(db, outbox.Config{BucketCount: cfg.Buckets}); err != nil {
		return nil, fmt.Errorf("bench: migrate: %w", err)
	}
	return e, nil
}

// open opens a new *gorm.DB (its own connection pool) on the run's
// database, with plugin registered when non-nil.
func (e *env) open(plugin *outbox.Plugin) (*gorm.DB, error) {
	db, err := gorm.Open(testenv.Dialector(e.cfg.DB, e.dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", e.cfg.DB, err)
	}
	if s, err := db.DB(); err == nil && e.cfg.MaxIdleConns > 0 {
		s.SetMaxIdleConns(e.cfg.MaxIdleConns)
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
	e.drop()
}

// reset empties the three outbox tables, then starts a fresh write-ahead
// log cycle, so that every contender of a run starts its preload and its
// drain in a fresh one. Left to the log's volume, a PostgreSQL checkpoint
// fell inside whichever contender's drain crossed the mark, whose deletes
// then logged whole pages the others' escaped (BENCHMARKS.md, Method);
// CHECKPOINT needs superuser or pg_checkpoint. InnoDB checkpoints
// continuously and logs no page images.
func (e *env) reset(db *gorm.DB) error {
	for _, t := range []string{outbox.DefaultMessagesTable, outbox.DefaultLeasesTable, outbox.DefaultRelaysTable} {
		stmt := "TRUNCATE TABLE " + t
		if e.cfg.DB == "sqlite" {
			stmt = "DELETE FROM " + t
		}
		if err := db.Exec(stmt).Error; err != nil {
			return fmt.Errorf("bench: empty %s: %w", t, err)
		}
	}
	if stmt := map[string]string{"postgres": "CHECKPOINT", "sqlite": "PRAGMA wal_checkpoint(TRUNCATE)"}[e.cfg.DB]; stmt != "" {
		if err := db.Exec(stmt).Error; err != nil {
			return fmt.Errorf("bench: %s: %w", stmt, err)
		}
	}
	return nil
}

// scenario opens an admin pool on the emptied outbox tables and, unless
// prefix is "", creates a fresh topic with cfg.Partitions partitions; done
// deletes the topic (best effort, so that a long run does not fill the
// broker's disk) and closes the pool.
func (e *env) scenario(ctx context.Context, prefix string) (admin *gorm.DB, topic string, done func(), err error) {
	if admin, err = e.open(nil); err != nil {
		return nil, "", nil, err
	}
	done = func() { closeDB(admin) }
	if err = e.reset(admin); err == nil && prefix != "" {
		topic = testenv.Unique(prefix)
		err = testenv.CreateTopic(ctx, nil, e.brokers, kafka.TopicConfig{Topic: topic, NumPartitions: e.cfg.Partitions, ReplicationFactor: 1})
		done = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := &kafka.Client{Addr: kafka.TCP(e.brokers...)}
			_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
			closeDB(admin)
		}
	}
	if err != nil {
		done()
		return nil, "", nil, err
	}
	return admin, topic, done, nil
}
