package storetest

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
)

// RandomRounds is the number of rounds of the randomised multi-relay run.
const RandomRounds = 2000

// EnvSeed names the environment variable that fixes the randomised run's
// seed, to replay a failure; the run logs the seed it used.
const EnvSeed = "STORETEST_SEED"

type simState int

const (
	simLive simState = iota
	simPaused
	simCrashed
	simStopped
)

// sim is a simulated relay and what it believes it owns: the buckets of
// its last acquisition or renewal, valid until expiry by its own clock.
type sim struct {
	r      *relayOf
	state  simState
	resume time.Time // when a paused relay wakes up
	owned  []int
	expiry time.Time
}

func randomisedRun(t *testing.T, f Factory) {
	const n = 8
	e := newEnv(t, f, n)
	rng := e.rng()
	var sims []*sim
	joined := 0
	join := func() {
		joined++
		id := fmt.Sprintf("relay-%02d", joined)
		// Sometimes restart a stopped relay under its old id.
		for _, s := range sims {
			if s.state == simStopped && rng.IntN(2) == 0 {
				s.state, s.owned = simLive, nil
				return
			}
		}
		sims = append(sims, &sim{r: e.relay(id)})
	}
	live := func() []*sim {
		var out []*sim
		for _, s := range sims {
			if s.state == simPaused && !e.clock.Now().Before(s.resume) {
				s.state = simLive
			}
			if s.state == simLive {
				out = append(out, s)
			}
		}
		return out
	}
	acquire := func(round int, ss []*sim) {
		now := e.clock.Now()
		errs := make([]error, len(ss))
		got := make([][]int, len(ss))
		var wg sync.WaitGroup
		for i, s := range ss {
			wg.Go(func() {
				var l relay.Leases
				l, errs[i] = s.r.s.AcquireBucketLeases(e.ctx, s.r.id, n, LeaseDuration)
				got[i] = l.Owned
			})
		}
		wg.Wait()
		for i, s := range ss {
			if errs[i] != nil {
				t.Fatalf("round %d: AcquireBucketLeases(%s) error: %v", round, s.r.id, errs[i])
			}
			s.owned, s.expiry = got[i], now.Add(LeaseDuration)
		}
	}
	counts := map[string]int{}
	for round := range RandomRounds {
		ls := live()
		if len(ls) == 0 {
			join()
			counts["join"]++
			ls = live()
		}
		switch p := rng.IntN(100); {
		case p < 50:
			acquire(round, ls[rng.IntN(len(ls)):][:1])
			counts["acquire"]++
		case p < 62:
			k := min(len(ls), 2+rng.IntN(3))
			rng.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
			acquire(round, ls[:k])
			counts["concurrent"]++
		case p < 70:
			s := ls[rng.IntN(len(ls))]
			if len(s.owned) == 0 {
				continue
			}
			now := e.clock.Now()
			held, err := s.r.s.RenewBucketLeases(e.ctx, s.r.id, s.owned, LeaseDuration)
			if err != nil {
				t.Fatalf("round %d: RenewBucketLeases(%s) error: %v", round, s.r.id, err)
			}
			if held {
				s.expiry = now.Add(LeaseDuration)
				counts["renewed"]++
			} else {
				s.owned = nil // the relay treats any loss as losing all
				counts["renewal lost"]++
			}
		case p < 76:
			if len(ls) < 6 {
				join()
				counts["join"]++
			}
		case p < 79:
			s := ls[rng.IntN(len(ls))]
			s.state = simCrashed // keeps its belief: a zombie until expiry
			counts["crash"]++
		case p < 83:
			s := ls[rng.IntN(len(ls))]
			s.state = simPaused
			s.resume = e.clock.Now().Add(LeaseDuration + time.Duration(rng.IntN(10_000))*time.Millisecond)
			counts["pause"]++
		case p < 87:
			s := ls[rng.IntN(len(ls))]
			if err := s.r.s.ReleaseBucketLeases(e.ctx, s.r.id); err != nil {
				t.Fatalf("round %d: ReleaseBucketLeases(%s) error: %v", round, s.r.id, err)
			}
			s.state, s.owned = simStopped, nil
			counts["stop"]++
		case p < 90:
			e.clock.Advance(LeaseDuration + time.Duration(rng.IntN(5_000))*time.Millisecond)
			counts["long advance"]++
		default:
		}
		e.clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		checkOwners(t, e, round, sims)
	}
	t.Logf("after %d rounds: %v, %d relays joined", RandomRounds, counts, joined)

	// Finally: zombies expire, the live relays converge to a fair partition.
	e.clock.Advance(LeaseDuration + time.Millisecond)
	ls := live()
	if len(ls) == 0 {
		join()
		ls = live()
	}
	for range 4 {
		for _, s := range ls {
			acquire(RandomRounds, []*sim{s})
			e.clock.Advance(time.Second)
		}
	}
	checkOwners(t, e, RandomRounds, sims)
	owned := map[string][]int{}
	for _, s := range ls {
		owned[s.r.id] = s.owned
	}
	var total, lo, hi = 0, n, 0
	for _, s := range ls {
		total += len(s.owned)
		lo, hi = min(lo, len(s.owned)), max(hi, len(s.owned))
	}
	if total != n || hi-lo > 1 {
		t.Fatalf("after settling, %d live relays own %v; want all %d buckets, shares differing by at most 1", len(ls), owned, n)
	}
}

// checkOwners fails if a bucket has two live owners (relays whose last
// result, by the manual clock, still holds it) or if the backend's lease
// table does not name a live owner.
func checkOwners(t *testing.T, e *env, round int, sims []*sim) {
	t.Helper()
	now := e.clock.Now()
	owner := map[int]*sim{}
	for _, s := range sims {
		if !s.expiry.After(now) {
			continue
		}
		for _, b := range s.owned {
			if o, ok := owner[b]; ok {
				t.Fatalf("round %d: bucket %d has two live owners, %s (until %v) and %s (until %v)",
					round, b, o.r.id, o.expiry, s.r.id, s.expiry)
			}
			owner[b] = s
		}
	}
	if e.h.Leases == nil || len(owner) == 0 {
		return
	}
	table := e.leases()
	for _, b := range slices.Sorted(maps.Keys(owner)) {
		s := owner[b]
		if l := table[b]; l.Owner != s.r.id || l.ExpiresAt.Before(s.expiry) {
			t.Fatalf("round %d: lease table has bucket %d owned by %q until %v; want %s until at least %v",
				round, b, l.Owner, l.ExpiresAt, s.r.id, s.expiry)
		}
	}
}
