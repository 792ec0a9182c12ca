package inbox_test

import (
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/internal/testenv/consumertest"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// effect is the side effect the tests' handlers write: one row per
// application of a message.
type effect struct {
	ID        uint   `gorm:"primaryKey"`
	MessageID string `gorm:"size:300"`
	Note      string `gorm:"size:100"`
}

// setup migrates the inbox and effect tables on db and returns an Inbox
// with opts, whose instruments a fresh metrictest.Reader collects (unless
// opts has a MeterProvider).
func setup(t testing.TB, db *gorm.DB, opts inbox.Options) (*inbox.Inbox, *metrictest.Reader) {
	t.Helper()
	if err := inbox.AutoMigrate(db, opts.Config); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&effect{}); err != nil {
		t.Fatal(err)
	}
	reader := metrictest.NewReader()
	if opts.MeterProvider == nil {
		opts.MeterProvider = reader.MeterProvider()
	}
	ib, err := inbox.New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ib, reader
}

// record returns a record of topic at partition/offset carrying id in the
// outbox's message-id header ("" for none).
func record(topic string, partition int, offset int64, id string) kafka.Message {
	m := kafka.Message{Topic: topic, Partition: partition, Offset: offset, Key: []byte("k"), Value: []byte("v")}
	if id != "" {
		m.Headers = []kafka.Header{{Key: "other", Value: []byte("x")}, {Key: kafkapub.DefaultMessageIDHeader, Value: []byte(id)}}
	}
	return m
}

// apply is a handler function writing one effect row for id.
func apply(id string) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error { return tx.Create(&effect{MessageID: id}).Error }
}

// effects returns the number of effect rows for id ("" for all).
func effects(t testing.TB, db *gorm.DB, id string) int64 {
	t.Helper()
	q := db.Model(&effect{})
	if id != "" {
		q = q.Where("message_id = ?", id)
	}
	var n int64
	if err := q.Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// recorded returns the number of processed ids in the default table.
func recorded(t testing.TB, db *gorm.DB) int64 {
	t.Helper()
	var n int64
	if err := db.Model(&inbox.ProcessedMessage{}).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// Helpers shared with the consumer suite.
var (
	collect     = consumertest.Collect
	withTimeout = consumertest.WithTimeout
)

type readings = consumertest.Readings

// forEachDB runs f on a fresh database of every available dialect.
func forEachDB(t *testing.T, f func(t *testing.T, o testenv.Opener, db *gorm.DB)) {
	t.Helper()
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) { f(t, o, o.Open(t, nil)) })
	}
}

// uniqueID returns a distinct message id for test i.
func uniqueID(prefix string, i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }
