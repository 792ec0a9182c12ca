package gormstore_test

// Helpers of gormstore's tests (bench_test.go there), for this package's
// tests: a test module cannot see another package's test files.

import (
	"time"

	"github.com/google/uuid"

	"github.com/gorm-outbox/outbox"
)

// pendingMessage returns a pending row of bucket, ready to insert.
func pendingMessage(bucket int32) *outbox.Message {
	return &outbox.Message{
		MessageID: outbox.UUID(uuid.New()), Bucket: bucket, Topic: "orders",
		Value: []byte("v"), CreatedAt: time.Now().UTC(),
	}
}
