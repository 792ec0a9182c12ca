package relay

import (
	"context"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Store is the relay's contract with the outbox's storage: where it finds
// pending messages, deletes published ones, parks the unpublishable, and
// coordinates bucket leases with its peers. gormstore.Store implements it
// for PostgreSQL, MySQL/MariaDB and SQLite, relaytest.MemStore in memory;
// the conformance kit (package storetest) checks any implementation.
//
// Every method must honour ctx and be safe for concurrent use: the relay
// calls NextBatch, MarkPublished and Park from its serving goroutines (never
// two of them for one bucket at once), RenewBucketLeases from its renewal
// goroutine, PendingMetrics from its metrics goroutine, all concurrently.
//
// A store may lack three capabilities, and says so through the contract
// rather than by leaving methods out:
//   - parking: FleetCanPark returns false, and a row the broker never
//     accepts then stops its bucket (retried forever) instead of being
//     parked;
//   - backlog metrics: PendingMetrics returns nil, nil (the backlog gauges
//     are then not exported);
//   - a clock of its own: ClockOffset returns ok false (its leases then run
//     on the relay hosts' clocks, which must agree within a fraction of
//     LeaseDuration − LeaseRenewInterval).
type Store interface {
	// AcquireBucketLeases runs one acquisition round for relayID: it records
	// a heartbeat, takes or keeps this relay's fair share of the bucketCount
	// buckets (see Shares) with leases lasting leaseDuration from now, frees
	// any excess, and returns the buckets the relay owns after the round, in
	// ascending order. Rows in a bucket outside [0, bucketCount) make it
	// return an error wrapping ErrMisconfigured.
	AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) ([]int, error)

	// RenewBucketLeases extends relayID's leases on buckets to now +
	// leaseDuration (never backwards) and refreshes its heartbeat, so that
	// a slow publish does not let a peer take over. It is all or nothing: it
	// returns true only if every bucket was still held by relayID,
	// unexpired, and was extended; false reports a lost lease.
	RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error)

	// ReleaseBucketLeases is a graceful stop: it marks relayID stopped (so
	// that a late statement of its own cannot claim buckets again) and then
	// frees its leases, so that a peer takes the buckets at once instead of
	// waiting for the leases to expire. The relay calls it once, after its
	// last publish.
	ReleaseBucketLeases(ctx context.Context, relayID string) error

	// BucketsWithPending returns the buckets among the given ones that hold
	// at least one pending message, in ascending order. It may report a
	// bucket whose only unparked rows are held (see NextBatch): the relay
	// then finds an empty batch.
	BucketsWithPending(ctx context.Context, buckets []int) ([]int, error)

	// NextBatch returns up to limit pending messages of bucket, oldest
	// (lowest submission order) first. With maxBytes > 0 it also stops
	// after the first row that brings the batch's total size, by
	// MessageSize, beyond maxBytes: that row is included, so that the relay
	// can tell a batch cut by its size from a drained bucket (it publishes
	// the rows within the bound, at least one, and fetches the rest again).
	// A store may count sizes its own way as long as it does not count a
	// row smaller than MessageSize does.
	//
	// Holds are the store's: NextBatch never returns a parked row, nor a
	// row of a key (non-nil) that has a parked row with a smaller id in the
	// same bucket whose reason does not start with CorruptReasonPrefix (a
	// corrupt row is parked alone). So a key's later rows wait behind its
	// parked row whatever a relay saw or missed, and requeueing or deleting
	// that row releases them. Rows parked with a reason starting with
	// HeldReasonPrefix (by relays of earlier releases) are parked rows like
	// any other.
	//
	// When the head row (the oldest pending row that is not parked) cannot
	// be decoded it returns a *CorruptRowError; the rows before a corrupt
	// row are returned without an error, so that it is reported once it is
	// the head.
	NextBatch(ctx context.Context, bucket, limit int, maxBytes int64) ([]*outbox.Message, error)

	// MarkPublished deletes published messages of bucket. published holds
	// instances of the slice NextBatch returned, in its order: a prefix of
	// it. A store must identify rows by ID, MessageID or a field of its own,
	// not by position; deleting only rows that are not parked is a safe
	// guard (a row may be parked after it was read).
	MarkPublished(ctx context.Context, bucket int, published []*outbox.Message) error

	// FleetCanPark reports whether every live relay of the outbox supports
	// parking (a relay of an older version would publish parked rows). The
	// relay asks before parking and retries the row instead while it is
	// false (a rolling upgrade in progress). A store that cannot park
	// returns false.
	FleetCanPark(ctx context.Context) (bool, error)

	// Park marks row id of bucket parked (in place, never deleted: it keeps
	// its id, message id, key, value, headers, created-at and bucket) at the
	// store's current time with reason (the store may truncate it to its
	// column size), in one atomic step with checking that relayID holds
	// bucket's lease unexpired on the store's clock (the clock the leases
	// are granted on). Without the lease it changes nothing and returns an
	// error wrapping ErrLeaseLost. A row already parked or gone is left as
	// it is (no error). Only the relay owning a bucket parks its rows;
	// requeue and deletion (ParkAdmin) may run anywhere.
	Park(ctx context.Context, relayID string, bucket int, id int64, reason string) error

	// PendingMetrics returns a backlog snapshot of the whole store, parked
	// rows counted apart; nil (with a nil error) means "unavailable", not
	// zero. The relay calls it at most once at a time, with a ctx bounded
	// by Options.MetricsTimeout, unless Options.MetricsBacklog is false.
	PendingMetrics(ctx context.Context) (*Pending, error)

	// ClockOffset returns the latest measured offset between the clock the
	// store's leases run on (gormstore: the database server's) and the
	// relay host's wall clock (the store's minus the host's), and its
	// uncertainty (typically half the round trip of the read that measured
	// it); ok is false while nothing was measured, or when the leases run
	// on the relay hosts' clocks. It must return a cached value and never
	// query. The relay exports it as the gauge MetricClockOffset and logs a
	// warning when it exceeds ClockOffsetWarnThreshold.
	ClockOffset() (offset, uncertainty time.Duration, ok bool)

	// BucketCount is the bucket count the outbox's writers use; New takes
	// it as the default Options.BucketCount and rejects one that disagrees.
	// Zero means the store does not know.
	BucketCount() int

	// ConcurrentBuckets reports whether the store gains from being called
	// for several buckets at once (New asks once). When true, the relay
	// serves up to Options.MaxConcurrentBuckets of its buckets at once
	// (their fetch, publish and delete overlapping), and with one bucket at
	// a time it fetches the next bucket's batch while it publishes the
	// current one. When false (a store whose writes serialise, like SQLite's
	// single writer, where the overlap is contention rather than speed) it
	// serves its buckets one after the other; the calls of its other
	// goroutines still overlap them.
	ConcurrentBuckets() bool
}

// Pending is a backlog snapshot of the whole store.
type Pending struct {
	// Count is the number of pending messages in every bucket, parked rows
	// excluded.
	Count int64
	// Oldest is the creation time of the oldest pending message that is not
	// parked; zero when there is none or the store cannot tell.
	Oldest time.Time
	// Parked is the number of parked rows; zero for a store that cannot
	// park.
	Parked int64
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
