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

// Containment (see Parker and Options.ParkPolicy): the relay side of
// parking. Per owned bucket the relay keeps the parked keys (key → the id of
// the key's first parked row), loaded with Parker.ParkedHeads before the
// bucket's first batch; a row of such a key is held behind that row
// (Parker.HoldBehind) instead of being published, unless its id is not
// greater than the head's, which means the key was requeued.

// strike counts the consecutive failed single-row publishes of a bucket's
// head row that the ParkPolicy counts.
type strike struct {
	id       int64 // the row
	n        int
	deferred bool // "parking deferred" was logged for this row
}

// parkedLoaded reports whether bucket b may be swept as far as parking is
// concerned: the store cannot park, or b's parked keys are loaded.
func (r *Relay) parkedLoaded(st *runState, b int) bool {
	if r.parker == nil {
		return true
	}
	return st.parked[b] != nil
}

// mayAct reports whether the relay may change bucket b's rows: its leases
// are valid by the relay's clock and b is one of them. It does not drop an
// invalid set (it runs on sweep workers; see drainOnce).
func (r *Relay) mayAct(st *runState, b int) bool {
	if !r.leaseValid(st) {
		return false
	}
	cur, _, _ := st.lease.snapshot()
	return containsSorted(cur, b)
}

// loadParked loads the parked keys of the owned buckets that have none
// loaded (newly owned) and are not backing off, in one ParkedHeads call. A
// failed call makes those buckets back off like a bucket store error; they
// are not swept until a later call succeeds.
func (r *Relay) loadParked(ctx context.Context, st *runState, owned []int) {
	if r.parker == nil {
		return
	}
	now := r.clock.Now()
	var need []int
	for _, b := range owned {
		if st.parked[b] != nil {
			continue
		}
		if hr := st.retry[b]; hr != nil && now.Before(hr.notBefore) {
			continue
		}
		need = append(need, b)
	}
	if len(need) == 0 || !r.checkLease(st) {
		return
	}
	st.worked.Store(true)
	heads, err := r.parker.ParkedHeads(ctx, need)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		err = fmt.Errorf("relay: load parked keys: %w", err)
		var waits []any
		for _, b := range need {
			_, wait := r.retryLater(st, b, err, false)
			waits = append(waits, wait)
		}
		r.logFailure(ctx, "load parked", "loading parked keys failed; backing off these buckets, the others go on", err, "buckets", need, "backoff", waits[0])
		return
	}
	for _, b := range need {
		st.parked[b] = map[string]int64{}
		st.clearRetry(b) // its only failure can have been a load
	}
	n := 0
	for _, h := range heads {
		if !containsSorted(need, h.Bucket) || h.Key == nil {
			continue
		}
		keys := st.parked[h.Bucket]
		if keys == nil {
			continue
		}
		if cur, ok := keys[string(h.Key)]; !ok || h.ID < cur {
			keys[string(h.Key)] = h.ID
			n++
		}
	}
	if n > 0 {
		r.log.InfoContext(ctx, "parked keys loaded; their later rows wait until they are requeued", "buckets", need, "keys", n)
	}
}

// forgetParked drops the parking state of bucket b (no longer owned).
func (st *runState) forgetParked(b int) {
	st.parked[b] = nil
	st.strikes[b] = nil
}

// holdParked holds the rows of batch (fetched from bucket b) whose key is
// parked behind the key's parked head, and returns the rows to publish, in
// their order. truncated reports that the batch was cut before a key whose
// head was requeued or deleted meanwhile (its rows come again, requeued
// head first, in the next batch). ok is false when the relay may no longer
// act on b (nothing is published).
func (r *Relay) holdParked(ctx context.Context, st *runState, b int, batch []*outbox.Message) (pub []*outbox.Message, truncated, ok bool, err error) {
	keys := st.parked[b]
	if len(keys) == 0 {
		return batch, false, true, nil
	}
	type hold struct {
		head  int64
		first int // index in batch of the key's first row
		ids   []int64
	}
	var order []string
	holds := map[string]*hold{}
	held := make([]bool, len(batch))
	for i, m := range batch {
		if m.Key == nil {
			continue
		}
		k := string(m.Key)
		head, parked := keys[k]
		if !parked {
			continue
		}
		if m.ID <= head { // the key was requeued: its rows flow again
			delete(keys, k)
			r.log.InfoContext(ctx, "parked key requeued; its rows flow again", "bucket", b, "key", printableKey(m.Key), "head", head)
			continue
		}
		h := holds[k]
		if h == nil {
			h = &hold{head: head, first: i}
			holds[k] = h
			order = append(order, k)
		}
		h.ids = append(h.ids, m.ID)
		held[i] = true
	}
	end := len(batch)
	for _, k := range order {
		h := holds[k]
		if h.first >= end {
			break // order is by first row: the later keys are cut too
		}
		if !r.mayAct(st, b) {
			return nil, false, false, nil
		}
		still, err := r.parker.HoldBehind(ctx, b, h.head, h.ids)
		if err != nil {
			return nil, false, false, errBucket{fmt.Errorf("relay: bucket %d: hold rows behind parked row %d: %w", b, h.head, err)}
		}
		if !still {
			// Requeued or deleted since the fetch: the requeued head (a
			// lower id) comes first in the next batch.
			delete(keys, k)
			end = h.first
			r.log.InfoContext(ctx, "parked key requeued or deleted meanwhile; its rows flow again from the next batch", "bucket", b, "key", printableKey([]byte(k)), "head", h.head)
			continue
		}
		r.m.countParked(ParkReasonHeld, len(h.ids))
		r.log.DebugContext(ctx, "rows held behind the parked row of their key", "bucket", b, "head", h.head, "rows", len(h.ids), "first", h.ids[0], "last", h.ids[len(h.ids)-1])
	}
	pub = make([]*outbox.Message, 0, end)
	for i, m := range batch[:end] {
		if !held[i] {
			pub = append(pub, m)
		}
	}
	return pub, end < len(batch), true, nil
}

// parkCorrupt parks the undecodable head row of bucket b alone, when the
// fleet can park; the bucket then goes on at once. Otherwise the error is
// the bucket's store error, as without parking.
func (r *Relay) parkCorrupt(ctx context.Context, st *runState, b int, ce *CorruptRowError) error {
	fetchErr := errBucket{fmt.Errorf("relay: bucket %d: next batch: %w", b, ce)}
	if r.parker == nil {
		return fetchErr
	}
	if !r.mayAct(st, b) {
		return nil
	}
	can, err := r.parker.FleetCanPark(ctx)
	if err != nil {
		return errBucket{fmt.Errorf("relay: bucket %d: can the fleet park: %w", b, err)}
	}
	if !can {
		return fetchErr // a live relay predates parking: back off as before
	}
	if !r.mayAct(st, b) {
		return nil
	}
	cause := ce.Error()
	if ce.Err != nil {
		cause = ce.Err.Error()
	}
	reason := CorruptReasonPrefix + cause
	if err := r.parker.Park(ctx, b, ce.ID, reason); err != nil {
		return errBucket{fmt.Errorf("relay: bucket %d: park corrupt row %d: %w", b, ce.ID, err)}
	}
	r.m.countParked(ParkReasonCorrupt, 1)
	r.log.WarnContext(ctx, "corrupt row parked; the rest of its bucket goes on", "bucket", b, "id", ce.ID, "reason", reason)
	st.clearRetry(b)
	st.strikes[b] = nil
	st.ready[b] = true
	return nil
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
	if r.parker == nil || len(batch) != 1 || ack != 0 {
		return false, nil // only a row published alone is judged
	}
	row := batch[0]
	s := st.strikes[b]
	if s == nil || s.id != row.ID {
		s = &strike{id: row.ID}
		st.strikes[b] = s
	}
	if !r.strikeCounts(pubErr) {
		s.n = 0
		return false, nil
	}
	s.n++
	if s.n < r.opts.ParkAfter {
		return false, nil
	}
	if !r.mayAct(st, b) {
		return true, nil
	}
	can, err := r.parker.FleetCanPark(ctx)
	if err != nil {
		return false, errBucket{fmt.Errorf("relay: bucket %d: can the fleet park: %w", b, err)}
	}
	if !can {
		if !s.deferred {
			s.deferred = true
			r.log.WarnContext(ctx, "parking deferred: a live relay predates parking; retrying the row", "bucket", b, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "attempts", s.n, "error", pubErr)
		}
		return false, nil
	}
	if !r.mayAct(st, b) {
		return true, nil
	}
	reason := pubErr.Error()
	if err := r.parker.Park(ctx, b, row.ID, reason); err != nil {
		return false, errBucket{fmt.Errorf("relay: bucket %d: park row %d: %w", b, row.ID, err)}
	}
	if row.Key != nil {
		st.parked[b][string(row.Key)] = row.ID
	}
	class := ParkReasonFailure
	if errors.Is(pubErr, ErrUnpublishable) {
		class = ParkReasonUnpublishable
	}
	r.m.countParked(class, 1)
	r.log.WarnContext(ctx, "row parked; later rows of its key wait until it is requeued", "bucket", b, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "key", printableKey(row.Key), "reason", reason, "attempts", s.n)
	st.clearRetry(b) // the bucket goes on at full speed
	st.strikes[b] = nil
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
