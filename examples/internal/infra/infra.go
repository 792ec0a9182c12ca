// Package infra starts what the examples run on, so that each example shows
// only the outbox: a SQLite file in a temporary directory, and Kafka (the
// cluster KAFKA_BROKERS names, or an in-process broker).
package infra

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// SQLite opens the SQLite file name in a new temporary directory, in WAL
// mode with a busy timeout and immediate transactions so that concurrent
// writers and the relay share it. done closes it and removes the directory.
func SQLite(name string) (db *gorm.DB, path string, done func(), err error) {
	dir, err := os.MkdirTemp("", "outbox-example-")
	if err != nil {
		return nil, "", nil, err
	}
	path = filepath.Join(dir, name)
	db, err = gorm.Open(sqlite.Open("file:"+path+"?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", nil, fmt.Errorf("open sqlite: %w", err)
	}
	sqlDB, _ := db.DB()
	return db, path, func() { _ = sqlDB.Close(); _ = os.RemoveAll(dir) }, nil
}

// Kafka returns the brokers of KAFKA_BROKERS when it is set, else starts an
// in-process broker (kfake) on loopback, and describes them.
func Kafka(opts ...kfake.Opt) (brokers []string, desc string, stop func(), err error) {
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		return strings.Split(v, ","), "KAFKA_BROKERS " + v, func() {}, nil
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...) // on 127.0.0.1, a random port
	if err != nil {
		return nil, "", nil, fmt.Errorf("start in-process broker: %w", err)
	}
	return c.ListenAddrs(), "in-process broker (kfake) at " + strings.Join(c.ListenAddrs(), ","), c.Close, nil
}

// CreateTopic creates topic: the relay creates no topics.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// RandomHex returns n random bytes in hex, for fresh topic names.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Drained waits until table holds no row (the relay deleted every row it
// published), or fails when ctx ends first.
func Drained(ctx context.Context, db *gorm.DB, table string) error {
	for {
		var left int64
		if err := db.Table(table).Count(&left).Error; err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d rows left in %s", left, table)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
