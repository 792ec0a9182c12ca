package relay

import (
	"context"
	"errors"

	"github.com/gorm-outbox/outbox"
)

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
	// Acknowledged is the contiguous acknowledged prefix of the batch.
	Acknowledged int
	// Err is the error of the first unacknowledged message; nil if and only
	// if the whole batch was acknowledged.
	Err error
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

// ErrFenced is wrapped by the error of a Publish that cannot publish the
// bucket under the relay's lease and never will: the relay drops the
// bucket, with no strike, until its next acquisition round.
var ErrFenced = errors.New("fenced")

// ErrPublisherAuth is wrapped by a publish error when the broker rejected
// the credentials; Health reports it until a publish is acknowledged.
var ErrPublisherAuth = errors.New("the broker rejected the publisher's credentials")
