package relay

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrUnpublishable is wrapped by a publish error that will recur for the
// row as stored, whatever the retry: the broker rejected the record as too
// large, invalid or for a topic that cannot exist or that the relay may not
// write, or the publisher cannot encode it. KafkaPublisher wraps it for
// such Kafka errors; a custom Publisher wraps it to let the default
// ParkPolicy park the row. Transient failures (a broker or leader
// unavailable, timeouts, network errors) must not wrap it.
var ErrUnpublishable = errors.New("the broker will never accept this row as stored")

// CorruptReasonPrefix starts the reason of a row parked because the store
// could not decode it. Such a row is parked alone: it does not hold the
// later rows of its key.
const CorruptReasonPrefix = "corrupt row: "

// HeldReasonPrefix starts the reason of a row parked behind an earlier
// parked row of its key (see Parker.HoldBehind); the id of that row follows.
const HeldReasonPrefix = "held behind parked row "

// CorruptRowError is returned by Store.NextBatch when the head row of the
// bucket (the oldest pending row that is not parked) cannot be decoded: a
// message id that is not a UUID, a header blob of an unknown codec version.
// NextBatch returns the rows before a corrupt row without an error, so the
// corrupt row is reported once it is the head. A relay whose store
// implements Parker parks it by id, with a reason starting with
// CorruptReasonPrefix, and goes on with the bucket.
type CorruptRowError struct {
	// ID and Bucket locate the row.
	ID     int64
	Bucket int
	// Err is the decoding error.
	Err error
}

func (e *CorruptRowError) Error() string {
	return fmt.Sprintf("bucket %d: row %d cannot be decoded: %v", e.Bucket, e.ID, e.Err)
}

func (e *CorruptRowError) Unwrap() error { return e.Err }

// ParkPolicy says which publish failures park a row (see Options.ParkPolicy).
type ParkPolicy int

const (
	// ParkUnpublishable, the default, parks a row whose publish failed
	// Options.ParkAfter consecutive times with an error wrapping
	// ErrUnpublishable. Transient failures never park: a broker outage parks
	// nothing.
	ParkUnpublishable ParkPolicy = iota
	// ParkNever retries every failing row forever, as the reference design
	// does: a row the broker never accepts stops its bucket. Corrupt rows are
	// still parked (they cannot be retried).
	ParkNever
	// ParkAnyFailure parks a row after Options.ParkAfter consecutive failed
	// publishes of any kind. A broker outage longer than ParkAfter backoff
	// steps parks the head row of every bucket that has one.
	ParkAnyFailure
)

func (p ParkPolicy) String() string {
	switch p {
	case ParkUnpublishable:
		return "unpublishable"
	case ParkNever:
		return "never"
	case ParkAnyFailure:
		return "any-failure"
	}
	return fmt.Sprintf("ParkPolicy(%d)", int(p))
}

// ParkedHead is the first parked row of a key in a bucket: every later row
// of that key in the bucket waits behind it until it is requeued or deleted.
type ParkedHead struct {
	Bucket int
	// Key is the record key (never nil: keyless rows are parked alone).
	Key []byte
	// ID is the lowest id among the key's parked rows in the bucket.
	ID int64
}

// Parker is an optional Store capability: containment. A row that can never
// be published is parked (marked in place, never deleted) together with the
// later rows of its key, so that the rest of its bucket flows on and per-key
// order is kept. NextBatch and BucketsWithPending of a Parker skip parked
// rows; PendingMetrics counts them in Pending.Parked. The conformance kit
// (package storetest) checks the contract.
//
// Only the relay owning a bucket parks its rows; requeue and deletion
// (ParkAdmin) may run anywhere. A parked row keeps its id, message id, key,
// value, headers, created-at and bucket.
type Parker interface {
	// FleetCanPark reports whether every live relay of the outbox supports
	// parking (a relay of an older version would publish parked rows). The
	// relay asks before parking and retries the row instead while it is
	// false (a rolling upgrade in progress).
	FleetCanPark(ctx context.Context) (bool, error)

	// ParkedHeads returns, for each of buckets, the parked keys: per
	// non-nil key, the lowest id among its parked rows that are neither
	// corrupt nor held (reason starting with neither CorruptReasonPrefix nor
	// HeldReasonPrefix). The relay calls it for the buckets it starts
	// owning, before their first batch.
	ParkedHeads(ctx context.Context, buckets []int) ([]ParkedHead, error)

	// Park marks row id of bucket parked at the store's current time with
	// reason (the store may truncate it to its column size). A row already
	// parked or gone is left as it is (no error).
	Park(ctx context.Context, bucket int, id int64, reason string) error

	// HoldBehind parks rows ids of bucket (later rows of head's key) with
	// the reason HeldReasonPrefix followed by head's id, atomically with checking that row head is still
	// parked: a concurrent requeue or deletion of head's key either sees
	// these rows parked (and requeues or deletes them too) or makes
	// HoldBehind return false and change nothing.
	HoldBehind(ctx context.Context, bucket int, head int64, ids []int64) (bool, error)
}

// ParkedRow is a parked row as ParkAdmin lists it.
type ParkedRow struct {
	ID        int64
	MessageID string // as stored (a corrupt row's may not be a UUID)
	Bucket    int
	Topic     string
	Key       []byte
	// Size is the length of the value plus the key, in bytes.
	Size      int
	CreatedAt time.Time
	ParkedAt  time.Time
	Reason    string
}

// ParkedSelector chooses parked rows for ParkAdmin's requeue and deletion.
// Exactly one of its fields is set.
type ParkedSelector struct {
	// ID chooses one row. A corrupt or keyless row is chosen alone; a row of
	// a parked key chooses every parked row of that key in its bucket, so
	// that the key's order is kept.
	ID int64
	// Key chooses every parked row of this key (an empty non-nil key is a
	// key), in every bucket, corrupt ones included.
	Key []byte
	// All chooses every parked row.
	All bool
}

// Validate reports an error when not exactly one field of s is set.
func (s ParkedSelector) Validate() error {
	n := 0
	if s.ID != 0 {
		n++
	}
	if s.Key != nil {
		n++
	}
	if s.All {
		n++
	}
	if n != 1 || s.ID < 0 {
		return errors.New("relay: a ParkedSelector needs exactly one of ID (> 0), Key or All")
	}
	return nil
}

// ParkAdmin is the operator's side of a Parker: list, requeue and delete
// parked rows. It is safe to call while relays run. Requeued rows flow again
// in id order (their original order), ahead of later rows of their key.
type ParkAdmin interface {
	// ListParked returns up to limit parked rows (limit ≤ 0: all) in
	// (bucket, id) order.
	ListParked(ctx context.Context, limit int) ([]ParkedRow, error)
	// RequeueParked clears the parked mark of the chosen rows and returns
	// how many rows it requeued.
	RequeueParked(ctx context.Context, sel ParkedSelector) (int64, error)
	// DeleteParked deletes the chosen parked rows (never an unparked one)
	// and returns how many it deleted.
	DeleteParked(ctx context.Context, sel ParkedSelector) (int64, error)
}
