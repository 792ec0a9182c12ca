package relay

import (
	"context"
	"errors"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Store is the relay's contract with the outbox's storage: pending
// messages, bucket leases shared with its peers, parking. Package
// storetest checks an implementation.
//
// Every method must honour ctx and be safe for concurrent use (the relay
// never calls two of NextBatches, MarkPublished and Park for one bucket at
// once, but a NextBatches that excludes the rows a MarkPublished still
// deletes). A store may lack parking (Fleet reports CanPark false),
// backlog metrics (PendingMetrics returns nil, nil) or a clock of its own
// (ClockOffset returns ok false: the relay hosts' clocks must then agree
// within a fraction of LeaseDuration − LeaseRenewInterval).
type Store interface {
	// AcquireBucketLeases runs one acquisition round for relayID: it records
	// a heartbeat, takes or keeps this relay's fair share of the bucketCount
	// buckets (Shares) with leases lasting leaseDuration from now, frees any
	// excess, and reports the round. It claims free buckets from ClaimStart,
	// and never a lease row it had to recreate before any earlier holder's
	// lease could have run out. A bucketCount that differs from the store's,
	// or rows in a bucket outside [0, bucketCount), make it return an error
	// wrapping ErrMisconfigured that names both counts, before it records a
	// heartbeat.
	AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) (Leases, error)
	// RenewBucketLeases extends relayID's leases on buckets to now +
	// leaseDuration (never backwards) and refreshes its heartbeat, all or
	// nothing: false reports that a bucket was no longer held, unexpired.
	RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error)
	// ReleaseBucketLeases marks relayID stopped (a late statement of its
	// own cannot claim buckets again) and frees its leases. The relay calls
	// it once, after its last publish.
	ReleaseBucketLeases(ctx context.Context, relayID string) error
	// BucketsWithPending returns the buckets among the given ones that hold
	// a pending message, ascending (possibly held: see BatchRequest).
	BucketsWithPending(ctx context.Context, buckets []int) ([]int, error)
	// NextBatches answers each request (see BatchRequest) in one call, one
	// statement where it can: results[i] answers reqs[i]. The requests name
	// distinct buckets. An error of the call itself is returned alone.
	NextBatches(ctx context.Context, reqs []BatchRequest) ([]BatchResult, error)
	// MarkPublished deletes published messages of any buckets, a prefix of
	// each bucket's batch NextBatches returned, identified by ID, MessageID
	// or a field of the store's; never a parked row.
	MarkPublished(ctx context.Context, published []*outbox.Message) error
	// Fleet reports the live relays (a heartbeat within the latest round's
	// lease duration, not stopped), cheaply: the relay calls it every
	// PollInterval.
	Fleet(ctx context.Context) (Fleet, error)
	// Park marks row id of bucket parked, in place, with reason (which the
	// store may truncate), in one atomic step with checking that relayID
	// holds bucket's lease unexpired on the store's clock; without the lease
	// it changes nothing and returns an error wrapping ErrLeaseLost. A row
	// already parked or gone is left as it is.
	Park(ctx context.Context, relayID string, bucket int, id int64, reason string) error
	// PendingMetrics returns a backlog snapshot of the whole store; nil
	// (with a nil error) means "unavailable", not zero.
	PendingMetrics(ctx context.Context) (*Pending, error)
	// ClockOffset returns the latest measured offset of the clock the
	// store's leases run on to the relay host's (the store's minus the
	// host's), and its uncertainty; ok is false while nothing was measured
	// or when the leases run on the hosts' clocks. It never queries.
	ClockOffset() (offset, uncertainty time.Duration, ok bool)
	// BucketCount is the writers' bucket count (see Options.BucketCount);
	// zero means the store does not know.
	BucketCount() int
}

// Leases is the outcome of an acquisition round (Store.AcquireBucketLeases).
type Leases struct {
	Owned   []int // the buckets the relay owns after the round, ascending
	Share   int   // the relay's fair share in the round (Shares)
	Relays  int   // live relays the round counted, the caller included
	Unowned int   // buckets without a live owner: free, expired, or held by a relay no longer live
}

// Fleet is what Store.Fleet reports of the live relays.
type Fleet struct {
	Relays  int  // live relays
	CanPark bool // every live relay supports parking; while false the relay retries a row instead
}

// BatchRequest is one request of Store.NextBatches: up to Limit pending
// messages of Buckets, oldest (lowest id) first across them, as if the rows
// of Exclude were gone. With MaxBytes > 0 the answer also stops after the
// first row that brings its size (by MessageSize, or more) beyond
// MaxBytes, that row included. The answer never includes a parked row, nor a row of a key (non-nil)
// with a parked row of a smaller id in the same bucket, unless that row is
// corrupt (CorruptReasonPrefix). A row that cannot be decoded ends the
// answer: the rows before it come with its *CorruptRowError.
type BatchRequest struct {
	Buckets  []int // distinct, ascending
	Limit    int
	MaxBytes int64 // 0: no byte bound
	// Exclude are rows of Buckets whose deletes still run beside this
	// fetch: the answer leaves them out, and Limit and MaxBytes count only
	// the rows returned. A store identifies them as MarkPublished does.
	Exclude []*outbox.Message
}

// BatchResult answers one BatchRequest.
type BatchResult struct {
	Rows []*outbox.Message
	Err  error // nil or a *CorruptRowError
}

// Pending is a backlog snapshot of the whole store.
type Pending struct {
	Count  int64     // pending messages, parked rows excluded
	Oldest time.Time // created_at of the oldest unparked one; zero: none or unknown
	Parked int64     // parked rows; zero for a store that cannot park
}

// ErrMisconfigured (outbox.ErrMisconfigured) is wrapped by the errors no
// retry can fix, with which Run stops: a bucket count differing from the
// fleet's, a publish longer than Options.MaxPublishDuration.
var ErrMisconfigured = outbox.ErrMisconfigured

// Publisher sends batches of messages, each in order, and reports how many
// of each the broker acknowledged.
type Publisher interface {
	// Publish sends batches (each the messages of one bucket, in submission
	// order) and returns once every message is acknowledged, failed, or ctx
	// is done: results[i] is batches[i]'s outcome. The relay deletes exactly
	// each batch's acknowledged prefix; a message sent but not acknowledged
	// may still be delivered.
	Publish(ctx context.Context, batches [][]*outbox.Message) []Result
	// OwnedBuckets tells the publisher the buckets its relay owns,
	// ascending, after every acquisition round and whenever the relay drops
	// buckets (an empty set when it stops), never concurrently with itself
	// nor with a Publish of a bucket that leaves the set. It must not
	// block, nor keep the slice. Most publishers do nothing (PublishFunc).
	OwnedBuckets(buckets []int)
}

// Result is the outcome of one batch of Publisher.Publish.
type Result struct {
	Acknowledged int   // the contiguous acknowledged prefix of the batch
	Err          error // the first unacknowledged message's; nil if and only if all were acknowledged
}

// PublishFunc is a Publisher made of one function, like http.HandlerFunc:
// Publish calls f, and OwnedBuckets does nothing.
type PublishFunc func(ctx context.Context, batches [][]*outbox.Message) []Result

// Publish calls f(ctx, batches).
func (f PublishFunc) Publish(ctx context.Context, batches [][]*outbox.Message) []Result {
	return f(ctx, batches)
}

// OwnedBuckets does nothing.
func (PublishFunc) OwnedBuckets([]int) {}

var (
	// ErrFenced is wrapped by the error of a Publish that cannot publish the
	// bucket under the relay's lease and never will: the relay drops the
	// bucket, with no strike, until its next acquisition round.
	ErrFenced = errors.New("fenced")
	// ErrPublisherAuth is wrapped by a publish error when the broker rejected
	// the credentials; Health reports it until a publish is acknowledged.
	ErrPublisherAuth = errors.New("the broker rejected the publisher's credentials")
)

// Clock is the relay's source of time and timers (relaytest.ManualClock in
// tests).
type Clock interface {
	// Now returns the current time. The relay compares only times it read
	// from the same Clock, so the system clock's monotonic reading is used.
	Now() time.Time
	// NewTimer starts a one-shot timer, like time.NewTimer; stop is like
	// time.Timer.Stop.
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// SystemClock is the Clock of package time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer starts a time.Timer.
func (SystemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}
