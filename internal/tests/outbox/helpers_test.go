package outbox_test

// Helpers of the root package's tests (notify_test.go there), for this
// package's tests: a test module cannot see another package's test files.

import (
	"slices"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// recorder is a non-blocking BucketNotifier that records every notification.
type recorder struct {
	mu     sync.Mutex
	events [][]int // one entry per call; nil for NotifyCommitted
}

func (r *recorder) NonBlockingNotifier() {}
func (r *recorder) NotifyCommitted() {
	r.mu.Lock()
	r.events = append(r.events, nil)
	r.mu.Unlock()
}
func (r *recorder) NotifyBucket(b int) {
	r.mu.Lock()
	r.events = append(r.events, []int{b})
	r.mu.Unlock()
}
func (r *recorder) NotifyBuckets(bs []int) {
	r.mu.Lock()
	r.events = append(r.events, slices.Clone(bs))
	r.mu.Unlock()
}
func (r *recorder) take() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.events
	r.events = nil
	return e
}

// notifyingDB opens a fresh database with the plugin reporting to a new
// recorder and the default outbox tables migrated.
func notifyingDB(t *testing.T, o testenv.Opener, cfg *gorm.Config) (*gorm.DB, *recorder) {
	t.Helper()
	rec := &recorder{}
	db := o.Open(t, cfg)
	if err := db.Use(outbox.Plugin{Notifier: rec}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	return db, rec
}

// inBucket returns a message pinned (by partition) to bucket b of 8.
func inBucket(b int32) *outbox.Message {
	return &outbox.Message{Topic: "orders", Partition: &b, Value: []byte("v")}
}
