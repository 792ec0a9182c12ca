package relay

import (
	"context"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Store is where the relay finds pending messages and coordinates bucket
// leases with its peers. gormstore.Store implements it for PostgreSQL,
// MySQL/MariaDB and SQLite; storetest checks any implementation.
//
// The relay calls Store methods from one goroutine at a time (lease renewal
// runs on its own goroutine, concurrently with publishes, never with another
// Store call except the optional PendingMetrics, which has its own
// goroutine), unless the store implements ConcurrentFetcher or
// ConcurrentStore. Every method must honour ctx.
type Store interface {
	// AcquireBucketLeases runs one acquisition round for relayID: it records
	// a heartbeat, takes or keeps this relay's fair share of the bucketCount
	// buckets (see Shares) with leases lasting leaseDuration from now, frees
	// any excess, and returns the buckets the relay owns after the round, in
	// ascending order. Rows in a bucket outside [0, bucketCount) make it
	// return an error wrapping ErrMisconfigured.
	AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) ([]int, error)

	// BucketsWithPending returns the buckets among the given ones that hold
	// at least one pending message, in ascending order.
	BucketsWithPending(ctx context.Context, buckets []int) ([]int, error)

	// NextBatch returns up to limit pending messages of bucket, oldest
	// (lowest submission order) first. A Parker skips parked rows and
	// reports an undecodable head row as a *CorruptRowError (see Parker).
	NextBatch(ctx context.Context, bucket, limit int) ([]*outbox.Message, error)

	// MarkPublished deletes published messages of bucket. published holds
	// instances of the slice NextBatch returned, in its order: a prefix of
	// it. A store must identify rows by ID, MessageID or a field of its own,
	// not by position; deleting only rows that are not parked is a safe
	// guard (a row may be parked after it was read).
	MarkPublished(ctx context.Context, bucket int, published []*outbox.Message) error
}

// LeaseRenewer is an optional Store capability: renewing leases while a
// publish is in flight, so a slow broker does not let a peer take over. The
// relay calls it from its renewal goroutine, concurrently with
// Publisher.Publish but never with another Store call.
type LeaseRenewer interface {
	// RenewBucketLeases extends relayID's leases on buckets to now +
	// leaseDuration (never backwards) and refreshes its heartbeat. It is all
	// or nothing: it returns true only if every bucket was still held by
	// relayID, unexpired, and was extended; false reports a lost lease.
	RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error)
}

// LeaseReleaser is an optional Store capability: a graceful stop. The relay
// calls it once, after its last publish, so that a peer can take the
// buckets at once instead of waiting for the leases to expire.
type LeaseReleaser interface {
	// ReleaseBucketLeases marks relayID stopped (so that a late statement of
	// its own cannot claim buckets again) and then frees its leases.
	ReleaseBucketLeases(ctx context.Context, relayID string) error
}

// Pending is a backlog snapshot of the whole store.
type Pending struct {
	// Count is the number of pending messages in every bucket, parked rows
	// excluded.
	Count int64
	// Oldest is the creation time of the oldest pending message that is not
	// parked; zero when there is none or the store cannot tell.
	Oldest time.Time
	// Parked is the number of parked rows (see Parker); zero for a store
	// that cannot park.
	Parked int64
}

// PendingMetricsStore is an optional Store capability: backlog metrics. The
// relay calls it from its metrics goroutine, concurrently with other Store
// calls, at most once at a time, with a ctx bounded by
// Options.MetricsTimeout. A nil snapshot means "unavailable", not zero.
type PendingMetricsStore interface {
	PendingMetrics(ctx context.Context) (*Pending, error)
}

// ClockOffsetReporter is an optional Store capability: a store whose leases
// run on a clock of its own (gormstore: the database server's) reports how
// far the relay host's wall clock is from it. The relay exports it as the
// gauge MetricClockOffset and logs a warning when it exceeds
// ClockOffsetWarnThreshold. The relay calls it from its metrics callback
// and after each acquisition round, concurrently with other Store calls.
type ClockOffsetReporter interface {
	// ClockOffset returns the latest measured offset, the store's clock
	// minus the relay host's wall clock, and its uncertainty (typically half
	// the round trip of the read that measured it); ok is false while
	// nothing was measured. It must return a cached value and never query.
	ClockOffset() (offset, uncertainty time.Duration, ok bool)
}

// ConcurrentFetcher is an optional Store capability. When
// ConcurrentNextBatch returns true (New asks once), the store allows
// NextBatch for one bucket to run concurrently with its other methods
// called for other buckets (MarkPublished, RenewBucketLeases, NextBatch),
// and the relay fetches the next ready bucket's batch while it publishes the
// current one, overlapping database and broker round trips. It only does so
// for stores that also implement LeaseRenewer. gormstore.Store implements
// it (true except on SQLite).
type ConcurrentFetcher interface {
	ConcurrentNextBatch() bool
}

// BucketCounter is an optional Store capability: a store that knows the
// bucket count its writers use. New takes it as the default BucketCount and
// rejects an Options.BucketCount that disagrees.
type BucketCounter interface {
	BucketCount() int
}

// Publisher sends a batch of messages, in order, and reports how many of
// them the broker acknowledged.
type Publisher interface {
	// Publish sends batch (the messages of one bucket, in submission order)
	// and returns once every message is acknowledged, failed, or ctx is done.
	// Result.Acknowledged is the length of the contiguous prefix of batch
	// that the broker acknowledged durably (acks=all); the relay deletes
	// exactly that prefix. A message handed to the broker but not
	// acknowledged may still be delivered: consumers deduplicate.
	Publish(ctx context.Context, batch []*outbox.Message) Result
}

// Result is the outcome of Publisher.Publish.
type Result struct {
	// Acknowledged is the contiguous acknowledged prefix of the batch.
	Acknowledged int
	// Err is the error of the first unacknowledged message; nil if and only
	// if the whole batch was acknowledged.
	Err error
}
