package outbox_test

import (
	"errors"
	"runtime/debug"
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

// FuzzCreateShapes builds, from the fuzzer's bytes, values of the shapes GORM
// accepts for Create with an outbox.Message model (structs, pointers,
// slices, arrays, maps, slices of maps, other and wrapping structs, nil
// elements) and runs them through the plugin's create callbacks (a dry
// run). The callbacks must never panic; a value they accept must consist of
// prepared messages only.
func FuzzCreateShapes(f *testing.F) {
	db, err := gorm.Open(sqlite.Open("file::memory:"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		f.Fatal(err)
	}
	if err := db.Use(outbox.Plugin{}); err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{{0}, {1, 0, 0}, {2, 0, 1, 0}, {3}, {4, 2, 2}, {5}, {6}, {7, 0, 3, 1}, {8, 0, 0}, {2, 0, 0, 0}} {
		f.Add(seed, true)
	}
	type wrapper struct{ outbox.Message }
	type other struct{ Topic string }
	f.Fuzz(func(t *testing.T, shape []byte, model bool) {
		next := func() byte {
			if len(shape) == 0 {
				return 0
			}
			b := shape[0]
			shape = shape[1:]
			return b
		}
		msg := func() *outbox.Message {
			topics := []string{"orders", "", "a.b", strings.Repeat("x", 250)}
			return &outbox.Message{Topic: topics[int(next())%len(topics)], Key: []byte{next()}}
		}
		var elems []any // the *Message elements, for the check
		elem := func() any {
			switch next() % 5 {
			case 0, 1:
				m := msg()
				elems = append(elems, m)
				return m
			case 2:
				return map[string]any{"Topic": "orders"}
			case 3:
				return &other{Topic: "orders"}
			default:
				return nil
			}
		}
		n := int(next() % 4)
		var v any
		switch next() % 9 {
		case 0:
			m := msg()
			elems = append(elems, m)
			v = m
		case 1:
			s := make([]outbox.Message, n)
			for i := range s {
				s[i] = *msg()
			}
			v = &s
			for i := range s {
				elems = append(elems, &s[i])
			}
		case 2:
			s := make([]*outbox.Message, n)
			for i := range s {
				if e, ok := elem().(*outbox.Message); ok {
					s[i] = e
				}
			}
			v = &s
		case 3:
			v = map[string]any{"Topic": "orders", "Key": []byte{next()}}
		case 4:
			s := make([]map[string]any, n)
			for i := range s {
				s[i] = map[string]any{"Topic": "orders"}
			}
			v = &s
		case 5:
			v = &other{Topic: "orders"}
		case 6:
			v = &wrapper{Message: *msg()}
		case 7:
			s := make([]any, n)
			for i := range s {
				s[i] = elem()
			}
			v = &s
		case 8:
			var a [2]outbox.Message
			a[0], a[1] = *msg(), *msg()
			v = &a
			elems = append(elems, &a[0], &a[1])
		}
		tx := db.Session(&gorm.Session{DryRun: true})
		if model {
			tx = tx.Model(&outbox.Message{})
		}
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Create(%T) panicked: %v\n%s", v, r, debug.Stack())
				}
			}()
			err = tx.Create(v).Error
		}()
		if err != nil {
			return
		}
		for _, e := range elems {
			if m, ok := e.(*outbox.Message); ok && (outbox.ValidateTopic(m.Topic) != nil || m.MessageID.IsZero()) && model {
				t.Fatalf("Create(%T) = nil but left message %+v unprepared", v, m)
			}
		}
	})
}
