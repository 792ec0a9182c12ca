// Package storetest is a conformance kit for relay.Store implementations,
// like testing/fstest for file systems: Run checks every Store behaviour the
// relay relies on — fair-share lease acquisition, takeover, renewal,
// graceful release, batches of one or several buckets, MarkPublished,
// misconfiguration, backlog metrics, parking (relay.ParkAdmin included),
// the store's clock offset — and a randomised multi-relay run asserting
// that no bucket ever has two live owners. Scenarios needing a capability
// the store lacks are skipped.
//
// A custom store (MongoDB, DynamoDB, …) passes it by giving Run a factory of
// Harness values, each on a fresh, empty backend:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, bucketCount int) *storetest.Harness {
//			backend := newBackend(t, bucketCount)
//			return &storetest.Harness{
//				NewStore: func(now func() time.Time) relay.Store { return backend.store(now) },
//				Insert:   backend.insert,
//			}
//		})
//	}
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Step names a part of an acquisition round that Harness.FailNext can make
// fail.
type Step string

// The steps a transient failure can be injected into.
const (
	// StepHeartbeat is the write of the relay's heartbeat.
	StepHeartbeat Step = "heartbeat"
	// StepSeed is the creation of the lease rows (the first round of a store
	// on a fresh backend).
	StepSeed Step = "seed"
)

// Lease is a lease as the backend stores it.
type Lease struct {
	// Bucket is the bucket number.
	Bucket int
	// Owner is the relay id holding it; empty when free.
	Owner string
	// ExpiresAt is the lease expiry; zero when free.
	ExpiresAt time.Time
}

// Harness connects Run to one fresh, empty backend configured with the
// bucket count the factory was given. Every store it makes shares that
// backend, as relays in several processes share one database.
type Harness struct {
	// NewStore returns a store on the backend reading the current time from
	// now (lease expiries and heartbeats). Run calls it once per simulated
	// relay, sometimes with a clock frozen in the past to replay a late
	// statement. Required.
	NewStore func(now func() time.Time) relay.Store

	// Insert writes msgs as pending messages, in order (so later messages of
	// a bucket are newer), exactly as given: the kit sets MessageID, Bucket
	// (possibly outside [0, bucketCount) to provoke a misconfiguration),
	// Topic, Key, Value and CreatedAt; the harness must not recompute them.
	// Required.
	Insert func(ctx context.Context, msgs []*outbox.Message) error

	// Leases reads every lease the backend stores. Optional: when set, the
	// kit also checks that the backend names the relay each live owner
	// believes it is, and that a late statement changes nothing.
	Leases func(ctx context.Context) ([]Lease, error)

	// SetLease writes a lease as given (it may be outside [0, bucketCount),
	// as a stale row left from a larger bucket count). Optional: the stale
	// lease scenario needs it.
	SetLease func(ctx context.Context, l Lease) error

	// FailNext makes the next execution of step, by any store of the
	// backend, fail once with a transient error. Optional: the transient
	// failure scenarios need it.
	FailNext func(step Step)

	// InsertCorrupt writes one pending row in bucket, after every row
	// inserted so far, that the store cannot decode (a header blob of an
	// unknown codec version, say), as a newer writer or a hand edit would.
	// Optional: the corrupt-row scenario of a store that parks needs it.
	InsertCorrupt func(ctx context.Context, bucket int) error
}

// Factory returns a Harness on a fresh, empty backend with bucketCount
// buckets. It may call t.Fatal on setup problems and register cleanups.
type Factory func(t *testing.T, bucketCount int) *Harness
