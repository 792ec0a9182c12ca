package relay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox"
)

// The relay side of parking: it counts a head row's failures and asks the
// store to park it, under its lease; which rows wait behind it is the
// store's decision (BatchRequest).

// strike counts the consecutive failed single-row publishes of a bucket's
// head row that the ParkPolicy counts.
type strike struct {
	id       int64 // the row
	n        int
	deferred bool // "parking deferred" was logged for this row
}

// parkCorrupt parks the undecodable head row of bucket b alone, when the
// fleet can park; the bucket then goes on at once. Otherwise the error is
// the bucket's store error, as without parking.
func (r *Relay) parkCorrupt(ctx context.Context, st *runState, b int, ce *CorruptRowError) error {
	cause := ce.Error()
	if ce.Err != nil {
		cause = ce.Err.Error()
	}
	reason := CorruptReasonPrefix + cause
	parked, can, err := r.park(ctx, st, b, ce.ID, reason)
	switch {
	case err != nil:
		return err
	case !can:
		return errBucket{fmt.Errorf("relay: bucket %d: next batch: %w", b, ce)} // a live relay predates parking: back off as before
	case !parked:
		return nil
	}
	r.m.countParked(ParkReasonCorrupt, 1)
	r.log.WarnContext(ctx, "corrupt row parked; the rest of its bucket goes on", "bucket", b, "id", ce.ID, "reason", reason)
	st.b[b].ready = true
	return nil
}

// park parks row id of bucket b with reason when the fleet can park and the
// relay owns b, and then ends the bucket's backoff and strikes: the bucket
// goes on at full speed. parked is false when the relay may no longer act
// on b; can is false when a live relay predates parking (nothing parked).
func (r *Relay) park(ctx context.Context, st *runState, b int, id int64, reason string) (parked, can bool, err error) {
	if !r.ownsBucket(st, b) {
		return false, true, nil
	}
	if f, err := r.store.Fleet(ctx); err != nil || !f.CanPark {
		if err != nil {
			err = errBucket{fmt.Errorf("relay: bucket %d: can the fleet park: %w", b, err)}
		}
		return false, f.CanPark, err
	}
	if !r.ownsBucket(st, b) {
		return false, true, nil
	}
	failpoint("relay/before-park")
	if err := r.store.Park(ctx, r.opts.RelayID, b, id, reason); err != nil {
		return false, true, errBucket{fmt.Errorf("relay: bucket %d: park row %d: %w", b, id, err)}
	}
	st.settled(b)
	return true, true, nil
}

// strikeCounts reports whether the policy counts a publish failure with err
// towards parking.
func (r *Relay) strikeCounts(err error) bool {
	switch r.opts.ParkPolicy {
	case ParkUnpublishable:
		return errors.Is(err, ErrUnpublishable)
	case ParkAnyFailure:
		return true // a stop's cancellation never gets here
	}
	return false
}

// strike records the failure of a publish of batch (from bucket b) whose
// first unacknowledged row is batch[ack], and parks that row when it has
// failed alone ParkAfter consecutive times in a way the policy counts and
// the fleet can park. parked reports that the row was parked (or that the
// relay may no longer act on b): the caller must not back the bucket off.
func (r *Relay) strike(ctx context.Context, st *runState, b int, batch []*outbox.Message, ack int, pubErr error) (parked bool, err error) {
	if len(batch) != 1 || ack != 0 {
		return false, nil // only a row published alone is judged
	}
	row := batch[0]
	s := st.b[b].strikes
	if s == nil || s.id != row.ID {
		s = &strike{id: row.ID}
		st.b[b].strikes = s
	}
	if !r.strikeCounts(pubErr) {
		s.n = 0
		return false, nil
	}
	s.n++
	if s.n < r.opts.ParkAfter {
		return false, nil
	}
	reason := pubErr.Error()
	parked, can, err := r.park(ctx, st, b, row.ID, reason)
	switch {
	case err != nil:
		return false, err
	case !can:
		if !s.deferred {
			s.deferred = true
			r.log.WarnContext(ctx, "parking deferred: a live relay predates parking; retrying the row", "bucket", b, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "attempts", s.n, "error", pubErr)
		}
		return false, nil
	case !parked:
		return true, nil
	}
	class := ParkReasonFailure
	if errors.Is(pubErr, ErrUnpublishable) {
		class = ParkReasonUnpublishable
	}
	r.m.countParked(class, 1)
	r.log.WarnContext(ctx, "row parked; later rows of its key wait until it is requeued", "bucket", b, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "key", printableKey(row.Key), "reason", reason, "attempts", s.n)
	return true, nil
}

// maxLoggedKey is the longest key printed in a log line, in bytes of text.
const maxLoggedKey = 64

// printableKey renders a record key for a log line: as text when it is
// printable UTF-8, else as hex, truncated to maxLoggedKey bytes with "…".
func printableKey(k []byte) string {
	if k == nil {
		return "<nil>"
	}
	printable := utf8.Valid(k) && strings.IndexFunc(string(k), func(c rune) bool { return !unicode.IsPrint(c) }) < 0
	s := string(k)
	if !printable {
		s = "0x" + hex.EncodeToString(k)
	}
	if len(s) > maxLoggedKey {
		cut := maxLoggedKey
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
