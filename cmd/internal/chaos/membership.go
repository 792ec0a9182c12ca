package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// Membership changes of a membership run (RunConfig.Membership).
const (
	ChangeJoin         = "join"           // a relay starts
	ChangeStop         = "stop"           // SIGTERM: a relay stops gracefully and releases its leases
	ChangeRestart      = "restart"        // SIGTERM, then a new process under the same relay id
	ChangeRestartNewID = "restart_new_id" // SIGTERM, then a new process under a new relay id
	ChangeKill         = "kill"           // SIGKILL: the relay's leases run out
)

// A membership run writes membershipRate messages a second (rolled-back
// ones included) unless RunConfig.Messages says otherwise, starts its
// changes membershipWarmup after the writers, and samples the owners every
// ownerSample.
const (
	membershipRate   = 300
	membershipWarmup = 2 * time.Second
	ownerSample      = 25 * time.Millisecond
)

// scheduled is one change of the membership schedule and how long the run
// waits after it.
type scheduled struct {
	kind   string
	settle time.Duration
}

// membershipSchedule is a membership run's changes, in order, from the
// initial relays (RunConfig.Relays, 2 by default): a third joins, one
// stops, one restarts under its id, one under a new id, one is killed (its
// buckets wait for its leases to run out) and later replaced.
func membershipSchedule() []scheduled {
	const settle = 2500 * time.Millisecond
	return []scheduled{
		{ChangeJoin, settle}, {ChangeStop, settle}, {ChangeRestart, settle}, {ChangeRestartNewID, settle},
		{ChangeKill, leaseDuration + 2*time.Second}, {ChangeJoin, settle},
	}
}

// membershipSpan is how long a membership run writes: its warm-up and
// every change's settle time.
func membershipSpan() time.Duration {
	d := membershipWarmup
	for _, c := range membershipSchedule() {
		d += c.settle
	}
	return d
}

// Handover is what a membership run measured for one kind of change.
type Handover struct {
	// Kind is the change (ChangeJoin, …); Changes how many the run made.
	Kind    string
	Changes int
	// Unowned is the longest stretch a bucket went without a live owner
	// (see ownerWatch) of those that began after a change of this kind and
	// before the next change.
	Unowned time.Duration
	// Delay is the longest delivery delay, from the writer's commit to the
	// checker's read, of the records first read after a change of this
	// kind and before the next change.
	Delay time.Duration
}

// change is one membership change a run made: its kind, the relay it
// started or stopped (the stopped one for a restart), and when.
type change struct {
	kind, relay string
	at          time.Time
}

// changeMembership makes the schedule's changes, telling w of every kill,
// and returns them once the last settle time is over.
func changeMembership(ctx context.Context, relays *Relays, w *ownerWatch, rng *rand.Rand, log *slog.Logger) ([]change, error) {
	var done []change
	next := time.Now().Add(membershipWarmup)
	for _, sc := range membershipSchedule() {
		sleepUntil(ctx, next)
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		c, err := changeOne(sc.kind, relays, w, rng)
		if err != nil {
			return done, fmt.Errorf("chaos: membership change %s: %w", sc.kind, err)
		}
		log.Info("chaos: membership change", "kind", c.kind, "relay", c.relay, "at", c.at)
		done = append(done, c)
		next = next.Add(sc.settle)
	}
	sleepUntil(ctx, next)
	return done, ctx.Err()
}

// changeOne makes one change; it began at the start of the new relay
// (join) or at the signal to the old one.
func changeOne(kind string, relays *Relays, w *ownerWatch, rng *rand.Rand) (change, error) {
	c := change{kind: kind, at: time.Now()}
	if kind == ChangeJoin {
		pr, err := relays.start(relays.set.nextID("relay"), true)
		if err == nil {
			c.relay = pr.ID
		}
		return c, err
	}
	pr := relays.set.take(rng.IntN)
	if pr == nil {
		return c, errors.New("no live relay")
	}
	c.relay, c.at = pr.ID, time.Now()
	if kind == ChangeKill {
		w.kill(pr.ID, c.at)
		pr.Kill()
		return c, nil
	}
	pr.Stop(15 * time.Second)
	switch kind {
	case ChangeRestart:
		_, err := relays.start(pr.ID, true)
		return c, err
	case ChangeRestartNewID:
		return c, relays.add(1)
	}
	return c, nil
}

func sleepUntil(ctx context.Context, t time.Time) { sleepCtx(ctx, time.Until(t)) }

// ownerWatch samples the lease and relays tables every ownerSample and
// records every stretch a bucket went without a live owner: an unexpired
// lease of a relay with a live heartbeat that the harness did not kill (a
// killed relay's buckets are unserved from the kill on).
type ownerWatch struct {
	db *gorm.DB

	mu       sync.Mutex
	killed   map[string]time.Time
	since    map[int32]time.Time // buckets without a live owner, since
	gaps     []gap               // closed stretches
	last     time.Time           // latest successful sample
	interval time.Duration       // longest time between two successful samples
}

type gap struct{ from, to time.Time }

func newOwnerWatch(db *gorm.DB) *ownerWatch {
	return &ownerWatch{db: db, killed: map[string]time.Time{}, since: map[int32]time.Time{}}
}

// kill records that relay id's process was killed at.
func (w *ownerWatch) kill(id string, at time.Time) {
	w.mu.Lock()
	w.killed[id] = at
	w.mu.Unlock()
}

// run samples until ctx is done, then closes the open stretches.
func (w *ownerWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		w.sample(ctx)
		sleepUntil(ctx, time.Now().Add(ownerSample))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for b, from := range w.since {
		w.gaps = append(w.gaps, gap{from, w.last})
		delete(w.since, b)
	}
}

func (w *ownerWatch) sample(ctx context.Context) {
	now := time.Now()
	var leases []outbox.BucketLease
	var beats []outbox.RelayHeartbeat
	if db := w.db.WithContext(ctx); db.Find(&leases).Error != nil || db.Find(&beats).Error != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ms := now.UnixMilli()
	live := map[string]bool{}
	for _, b := range beats {
		k, killed := w.killed[b.RelayID]
		live[b.RelayID] = b.StoppedAtMs == nil && b.LastSeenMs > ms-leaseDuration.Milliseconds() && !(killed && !now.Before(k))
	}
	for _, l := range leases {
		owned := l.Owner != nil && l.ExpiresAtMs > ms && live[*l.Owner]
		from, open := w.since[l.Bucket]
		switch {
		case owned && open:
			w.gaps = append(w.gaps, gap{from, now})
			delete(w.since, l.Bucket)
		case !owned && !open:
			w.since[l.Bucket] = now
		}
	}
	if !w.last.IsZero() {
		w.interval = max(w.interval, now.Sub(w.last))
	}
	w.last = now
}

// handovers returns a membership run's figures per kind of change, in the
// order of their first change, and its longest delivery delay overall:
// gaps are the stretches without a live owner, committedAt the writers'
// commit times, parts the records the checker read.
func handovers(changes []change, gaps []gap, committedAt map[string]time.Time, parts [][]Record) ([]Handover, time.Duration) {
	var hs []Handover
	of := make([]int, len(changes)) // change → its kind's index in hs
	for i, c := range changes {
		j := slices.IndexFunc(hs, func(h Handover) bool { return h.Kind == c.kind })
		if j < 0 {
			j = len(hs)
			hs = append(hs, Handover{Kind: c.kind})
		}
		hs[j].Changes++
		of[i] = j
	}
	// after returns the Handover of the last change at or before t.
	after := func(t time.Time) *Handover {
		i := sort.Search(len(changes), func(i int) bool { return changes[i].at.After(t) }) - 1
		if i < 0 {
			return nil
		}
		return &hs[of[i]]
	}
	for _, g := range gaps {
		if h := after(g.from); h != nil {
			h.Unowned = max(h.Unowned, g.to.Sub(g.from))
		}
	}
	first := map[string]time.Time{} // id → first read
	for _, p := range parts {
		for _, r := range p {
			if t, ok := first[r.ID]; !ok || r.Received.Before(t) {
				first[r.ID] = r.Received
			}
		}
	}
	var longest time.Duration
	for id, read := range first {
		at, ok := committedAt[id]
		if !ok {
			continue
		}
		d := read.Sub(at)
		longest = max(longest, d)
		if h := after(read); h != nil {
			h.Delay = max(h.Delay, d)
		}
	}
	return hs, longest
}

// membershipString is Summary.String for a membership run.
func (s Summary) membershipString() string {
	var hs []string
	for _, h := range s.Handovers {
		hs = append(hs, fmt.Sprintf("%s×%d unowned=%s delay=%s", h.Kind, h.Changes, h.Unowned.Round(time.Millisecond), h.Delay.Round(time.Millisecond)))
	}
	return fmt.Sprintf("membership: db=%s broker=%s messages=%d committed=%d rolled_back=%d in_doubt=%d lost=%d rolled_back_arrived=%d order_violations=%d dual_owners=%d (lease changes %d, audits %d) drained=%t duplicates=%d records=%d delay=%s owners_sampled_every<=%s changes: %s took=%s",
		s.Dialect, s.Broker, s.Written, s.Committed, s.RolledBack, s.InDoubt, s.Check.Lost, s.Check.RolledBackArrived, s.Check.OrderViolations,
		s.DualOwners, s.LeaseChanges, s.LeaseAudits, s.Drained, s.Check.Duplicates, s.Check.Records, s.Delay.Round(time.Millisecond),
		s.OwnerSampling.Round(time.Millisecond), strings.Join(hs, ", "), s.Took.Round(time.Second))
}
