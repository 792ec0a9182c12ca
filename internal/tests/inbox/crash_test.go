package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// The crash test's child process reads its setup from these variables.
const (
	envCrashChild   = "INBOX_TEST_CRASH_CHILD"
	envCrashDialect = "INBOX_TEST_CRASH_DIALECT"
	envCrashDSN     = "INBOX_TEST_CRASH_DSN"
	envCrashBrokers = "INBOX_TEST_CRASH_BROKERS"
	envCrashTopic   = "INBOX_TEST_CRASH_TOPIC"
	envCrashGroup   = "INBOX_TEST_CRASH_GROUP"
)

// crashMarker is what the child prints right before it kills itself.
const crashMarker = "CRASH-CHILD: transaction committed; killing the process before the offset commit"

// openDSN opens dsn of dialect with a quiet logger.
func openDSN(dialect, dsn string) (*gorm.DB, error) {
	var d gorm.Dialector
	switch dialect {
	case testenv.Postgres:
		d = postgres.Open(dsn)
	case testenv.MySQL:
		d = mysql.Open(dsn)
	default:
		d = sqlite.Open(dsn)
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
}

// sharedDB returns a fresh database of o that another process can open
// too, and its DSN.
func sharedDB(t *testing.T, o testenv.Opener) (*gorm.DB, string) {
	t.Helper()
	var dsn string
	switch o.Name {
	case testenv.Postgres:
		var ok bool
		if dsn, ok = testenv.PostgresDSN(t); !ok {
			t.Skip("no PostgreSQL")
		}
	case testenv.MySQL:
		db := o.Open(t, nil) // a fresh database, dropped at cleanup
		var name string
		if err := db.Raw("SELECT DATABASE()").Scan(&name).Error; err != nil {
			t.Fatal(err)
		}
		c, err := mysqldrv.ParseDSN(os.Getenv(testenv.EnvMySQL))
		if err != nil {
			t.Fatal(err)
		}
		c.DBName, c.ParseTime, c.Loc = name, true, time.UTC
		dsn = c.FormatDSN()
	default:
		dsn = "file:" + filepath.Join(t.TempDir(), "crash.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	}
	db, err := openDSN(o.Name, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	return db, dsn
}

// TestCrashBetweenTransactionAndOffsetCommit kills a consumer process
// (SIGKILL) after its transaction committed and before it committed the
// offset; a consumer started afterwards in the same group gets the record
// again and skips it as a duplicate, then goes on.
func TestCrashBetweenTransactionAndOffsetCommit(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, o testenv.Opener, b testenv.Broker) {
		db, dsn := sharedDB(t, o)
		topic, group := testenv.Unique("inbox-crash-"), testenv.Unique("g-")
		b.CreateTopic(t, topic, 1, nil)
		produce(t, b, topic, withID(0, "crash-1", "first"), withID(0, "crash-2", "second"))
		ib, reader := setup(t, db, inbox.Options{})

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChildProcess$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			envCrashChild+"=1", envCrashDialect+"="+o.Name, envCrashDSN+"="+dsn,
			envCrashBrokers+"="+strings.Join(b.Addrs, ","), envCrashTopic+"="+topic, envCrashGroup+"="+group)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err == nil || cmd.ProcessState.Success() || !strings.Contains(out.String(), crashMarker) {
			t.Fatalf("child = %v; want it killed after %q:\n%s", err, crashMarker, out.String())
		}
		if !strings.Contains(cmd.ProcessState.String(), "killed") {
			t.Fatalf("child ended with %s; want killed", cmd.ProcessState)
		}
		if n := effects(t, db, "crash-1"); n != 1 {
			t.Fatalf("effects of crash-1 after the crash = %d; want 1 (the transaction committed)", n)
		}
		if got := committed(t, b, group, topic, 1)[0]; got > 0 {
			t.Fatalf("committed offset after the crash = %d; want none", got)
		}

		// The restart: the group redelivers crash-1, which is a duplicate.
		var calls atomic.Int32
		fn := func(tx *gorm.DB, m kafka.Message) error {
			calls.Add(1)
			return applyRecord(tx, m)
		}
		c, err := inbox.NewConsumer(ib, groupReader(t, b, topic, group), "crash", fn, inbox.ConsumerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		waitCommitted(t, b, group, topic, map[int]int64{0: 2})
		stop()
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler calls after the restart = %d; want 1 (crash-2 only)", n)
		}
		if a, b := effects(t, db, "crash-1"), effects(t, db, "crash-2"); a != 1 || b != 1 {
			t.Fatalf("effects = %d, %d; want 1, 1", a, b)
		}
		collect(t, reader).Check(t, readings{inbox.MetricDuplicates: 1, inbox.MetricProcessed: 1, inbox.MetricFailures: 0})
	})
}

// TestCrashChildProcess is the consumer process TestCrashBetweenTransactionAndOffsetCommit
// kills; it does nothing in a normal run.
func TestCrashChildProcess(t *testing.T) {
	if os.Getenv(envCrashChild) == "" {
		t.Skip("the child process of TestCrashBetweenTransactionAndOffsetCommit")
	}
	db, err := openDSN(os.Getenv(envCrashDialect), os.Getenv(envCrashDSN))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, inbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(groupReaderConfig(strings.Split(os.Getenv(envCrashBrokers), ","), os.Getenv(envCrashTopic), os.Getenv(envCrashGroup)))
	kill := watchedReader{Reader: r, onCommit: func(context.Context, []kafka.Message) error {
		fmt.Println(crashMarker)
		p, err := os.FindProcess(os.Getpid())
		if err == nil {
			err = p.Kill() // SIGKILL: no deferred function, no group leave
		}
		t.Errorf("kill: %v", err)
		select {}
	}}
	c, err := inbox.NewConsumer(ib, kill, "crash", applyRecord, inbox.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Fatalf("Run = %v; want the process killed first", c.Run(ctx))
}
