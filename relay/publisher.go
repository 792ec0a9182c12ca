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
	// order; the relay sends several shallow buckets' at once) and returns
	// once every message is acknowledged, failed, or ctx is done: results[i]
	// is batches[i]'s outcome. The relay deletes exactly each batch's
	// acknowledged prefix (acks=all); a message sent but not acknowledged
	// may still be delivered. A failure of one batch may leave another's
	// later messages unsent (not acknowledged): that batch's error then
	// says so.
	Publish(ctx context.Context, batches [][]*outbox.Message) []Result

	// OwnedBuckets tells the publisher the buckets its relay owns,
	// ascending, after every acquisition round (an unchanged set included)
	// and whenever the relay drops buckets (an empty set when it stops or
	// its leases expire), never concurrently with itself nor with a Publish
	// of a bucket that leaves the set. It must not block, nor modify or
	// keep the slice. A publisher that does not need it (all but kafkapub's
	// fenced mode, which initialises a producer per owned bucket) does
	// nothing.
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

// ErrFenced is wrapped by the error of a Publish that cannot publish its
// bucket's rows under the relay's current lease and never will (kafkapub's
// fenced mode: fenced by a newer owner, transaction aborted, not
// initialised, or a bucket the relay never reported owning). The relay
// drops that bucket, with no strike for the row, and takes it back at its
// next acquisition round, ErrorBackoff later, if the store still grants it.
var ErrFenced = errors.New("fenced")

// ErrPublisherAuth is wrapped by a publish error when the broker rejected
// the publisher's credentials, which no retry of a row can cure (kafkapub
// wraps it for SASL failures; a custom Publisher may too). Health reports
// it until a publish is acknowledged again; a broker certificate that does
// not verify (crypto/tls, crypto/x509 errors) counts too, without it.
var ErrPublisherAuth = errors.New("the broker rejected the publisher's credentials")
