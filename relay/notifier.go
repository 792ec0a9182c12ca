package relay

import (
	"log/slog"
	"math/bits"
	"sync/atomic"

	"github.com/gorm-outbox/outbox"
)

// Notifier wakes its relay when committed rows are waiting: pass it to
// outbox.Plugin, or call it after a confirmed commit (never before). It
// keeps a bit per bucket; only hints for owned buckets wake the relay. Its
// methods are safe for concurrent use and never block; a nil *Notifier
// ignores every call. Until relay.New attaches it, notifications wake
// nothing (the first is logged at WARN).
type Notifier struct {
	attached atomic.Bool
	warned   atomic.Bool // the unattached warning was logged
	state    atomic.Pointer[notifyState]
	unknown  atomic.Bool
	wake     chan struct{}

	// Outgoing hints for Options.HintTransport, until the sender takes them.
	sending    atomic.Bool
	outUnknown atomic.Bool
	outWake    chan struct{}
}

type notifyState struct {
	n      int
	owned  []atomic.Uint64
	hinted []atomic.Uint64
	out    []atomic.Uint64 // committed locally, not yet sent to peers
	any    atomic.Bool     // owns at least one bucket
}

// NewNotifier returns a Notifier, for outbox.Plugin and Options.Notifier.
func NewNotifier() *Notifier {
	return &Notifier{wake: make(chan struct{}, 1), outWake: make(chan struct{}, 1)}
}

var (
	_ outbox.BucketNotifier = (*Notifier)(nil)
	_ outbox.NonBlocking    = (*Notifier)(nil)
)

// NonBlockingNotifier marks the Notifier as never blocking (outbox.NonBlocking).
func (*Notifier) NonBlockingNotifier() {}

// NotifyCommitted reports committed rows in unknown buckets: the relay, if
// it owns any bucket, looks for pending rows in all its buckets.
func (n *Notifier) NotifyCommitted() {
	if n == nil {
		return
	}
	n.checkAttached()
	if n.sending.Load() {
		n.outUnknown.Store(true)
		nudge(n.outWake)
	}
	n.localUnknown()
}

func (n *Notifier) localUnknown() {
	n.unknown.Store(true)
	if st := n.state.Load(); st != nil && st.any.Load() {
		nudge(n.wake)
	}
}

// NotifyBucket reports committed rows in bucket; a negative bucket means
// unknown (as NotifyCommitted).
func (n *Notifier) NotifyBucket(bucket int) {
	if n == nil {
		return
	}
	if bucket < 0 {
		n.NotifyCommitted()
		return
	}
	st := n.state.Load()
	if st == nil {
		n.checkAttached()
		return
	}
	if n.sending.Load() {
		if bucket >= st.n {
			n.outUnknown.Store(true)
		} else {
			st.out[bucket/64].Or(uint64(1) << (bucket % 64))
		}
		nudge(n.outWake)
	}
	n.local(st, bucket)
}

func (n *Notifier) checkAttached() {
	if n.attached.Load() || !n.warned.CompareAndSwap(false, true) {
		return
	}
	slog.Default().Warn("a commit notified a notifier that no relay uses (yet); until relay.New takes it in Options.Notifier, commits wait for polling. Harmless once at startup, before the relay is built; otherwise pass this notifier to relay.New")
}

// receive takes a hint from the transport, never sent on.
func (n *Notifier) receive(bucket int) {
	if bucket < 0 {
		n.localUnknown()
		return
	}
	if st := n.state.Load(); st != nil {
		n.local(st, bucket)
	}
}

func (n *Notifier) local(st *notifyState, bucket int) {
	if bucket >= st.n {
		return
	}
	w, bit := bucket/64, uint64(1)<<(bucket%64)
	if st.owned[w].Load()&bit == 0 {
		return
	}
	st.hinted[w].Or(bit)
	nudge(n.wake)
}

// NotifyBuckets reports committed rows in each of buckets.
func (n *Notifier) NotifyBuckets(buckets []int) {
	for _, b := range buckets {
		n.NotifyBucket(b)
	}
}

// nudge sends on c, a channel of one slot, unless a signal already waits.
func nudge(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (n *Notifier) takeOut(dst []int) ([]int, bool) {
	return takeBits(dst, n.state.Load().out, nil), n.outUnknown.Swap(false)
}

func takeBits(dst []int, words, mask []atomic.Uint64) []int {
	for i := range words {
		w := words[i].Swap(0)
		if mask != nil {
			w &= mask[i].Load()
		}
		for ; w != 0; w &= w - 1 {
			dst = append(dst, i*64+bits.TrailingZeros64(w))
		}
	}
	return dst
}

func (n *Notifier) attach(bucketCount int) bool {
	if !n.attached.CompareAndSwap(false, true) {
		return false
	}
	words := (bucketCount + 63) / 64
	n.state.Store(&notifyState{n: bucketCount, owned: make([]atomic.Uint64, words), hinted: make([]atomic.Uint64, words), out: make([]atomic.Uint64, words)})
	return true
}

func (n *Notifier) setOwned(buckets []int) {
	st := n.state.Load()
	words := make([]uint64, len(st.owned))
	for _, b := range buckets {
		if b >= 0 && b < st.n {
			words[b/64] |= 1 << (b % 64)
		}
	}
	for i, w := range words {
		st.owned[i].Store(w)
		st.hinted[i].And(w)
	}
	st.any.Store(len(buckets) > 0)
}

func (n *Notifier) take(dst []int) ([]int, bool) {
	st := n.state.Load()
	return takeBits(dst, st.hinted, st.owned), n.unknown.Swap(false)
}
