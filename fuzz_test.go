package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
)

// FuzzPrepareMessage feeds arbitrary messages and bucket counts through the
// plugin's create path (a dry run: callbacks, no SQL) and checks that
// validation never panics, rejects with ErrInvalidMessage (or a Config
// error), and fills an accepted message consistently.
func FuzzPrepareMessage(f *testing.F) {
	db, err := gorm.Open(sqlite.Open("file::memory:"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		f.Fatal(err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		f.Fatal(err)
	}
	f.Add("orders", []byte("k"), false, int32(0), false, int32(0), 8)
	f.Add("", []byte(nil), true, int32(-1), true, int32(3), 0)
	f.Add("a.b-c_D9", []byte{}, false, int32(7), true, int32(7), 1)
	f.Add("..", []byte("x"), false, int32(0), false, int32(99), -5)
	f.Add(strings.Repeat("t", 250), []byte("x"), false, int32(0), false, int32(0), 70000)
	f.Fuzz(func(t *testing.T, topic string, key []byte, keyless bool, partition int32, hasPartition bool, bucket int32, bucketCount int) {
		m := &outbox.Message{Topic: topic, Key: key, Value: []byte("v"), Bucket: bucket}
		if keyless {
			m.Key = nil
		}
		if hasPartition {
			m.Partition = &partition
		}
		cfg := outbox.Config{BucketCount: bucketCount}
		err := db.Session(&gorm.Session{DryRun: true}).Scopes(outbox.WithConfig(cfg)).Create(m).Error
		if cfg.Validate() != nil {
			if err == nil {
				t.Fatalf("Create with invalid %+v = nil; want an error", cfg)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("Create(topic %q) = %v; want an error wrapping ErrInvalidMessage", topic, err)
			}
			return
		}
		n := cfg.WithDefaults().BucketCount
		if verr := outbox.ValidateTopic(m.Topic); verr != nil {
			t.Fatalf("Create accepted topic %q: ValidateTopic = %v", m.Topic, verr)
		}
		if m.Partition != nil && *m.Partition < 0 {
			t.Fatalf("Create accepted partition %d", *m.Partition)
		}
		if m.MessageID.IsZero() || m.CreatedAt.IsZero() {
			t.Fatalf("Create left MessageID %v, CreatedAt %v unset", m.MessageID, m.CreatedAt)
		}
		if want := outbox.BucketOf(m.Key, m.Partition, m.MessageID, n); m.Bucket != want || m.Bucket < 0 || int(m.Bucket) >= n {
			t.Fatalf("Create set bucket %d; want %d in [0, %d)", m.Bucket, want, n)
		}
		if bucket != 0 && bucket != m.Bucket {
			t.Fatalf("Create accepted caller bucket %d, computed %d", bucket, m.Bucket)
		}
	})
}
