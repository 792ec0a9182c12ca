package relay_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorm-outbox/outbox/relay"
)

func TestShares(t *testing.T) {
	t.Run("sum_to_N_and_differ_by_at_most_one", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 5000; i++ {
			n := 1 + rng.IntN(64)
			r := 1 + rng.IntN(20)
			held := map[string]int{}
			for j := 0; j < r; j++ {
				held[fmt.Sprintf("relay-%02d", rng.IntN(100))] = rng.IntN(n + 1)
			}
			s := relay.Shares(n, held)
			sum, lo, hi := 0, n+1, -1
			for id := range held {
				v := s[id]
				sum += v
				lo, hi = min(lo, v), max(hi, v)
			}
			if sum != n || hi-lo > 1 || len(s) != len(held) {
				t.Fatalf("Shares(%d, %v) = %v: sum %d, spread %d; want sum %d, spread <= 1", n, held, s, sum, hi-lo, n)
			}
		}
	})
	t.Run("incumbents_keep_the_remainder", func(t *testing.T) {
		got := relay.Shares(8, map[string]int{"a": 0, "b": 0, "z": 8})
		if got["z"] != 3 || got["a"] != 3 || got["b"] != 2 {
			t.Fatalf("Shares(8, a:0 b:0 z:8) = %v; want z:3 a:3 b:2", got)
		}
	})
	t.Run("joiner_beyond_N_gets_none", func(t *testing.T) {
		got := relay.Shares(2, map[string]int{"a": 1, "b": 1, "c": 0})
		if got["a"] != 1 || got["b"] != 1 || got["c"] != 0 {
			t.Fatalf("Shares(2, a:1 b:1 c:0) = %v; want a:1 b:1 c:0", got)
		}
	})
	t.Run("shares_stable_while_relays_converge", func(t *testing.T) {
		// Random fleets move one lease at a time toward their shares; the
		// shares computed at every step must equal the first ones.
		rng := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < 3000; i++ {
			n := 1 + rng.IntN(32)
			r := 1 + rng.IntN(12)
			held := map[string]int{}
			free := n
			for j := 0; j < r; j++ {
				id := fmt.Sprintf("r%03d", rng.IntN(1000))
				if _, dup := held[id]; dup {
					continue
				}
				k := rng.IntN(free + 1)
				held[id] = k
				free -= k
			}
			want := relay.Shares(n, held)
			for step := 0; step < 4*n; step++ {
				// One relay moves one lease toward its share.
				var movers []string
				for id, h := range held {
					if h != want[id] {
						movers = append(movers, id)
					}
				}
				if len(movers) == 0 {
					break
				}
				id := movers[rng.IntN(len(movers))]
				if held[id] > want[id] {
					held[id]--
					free++
				} else if free > 0 {
					held[id]++
					free--
				}
				got := relay.Shares(n, held)
				for id := range held {
					if got[id] != want[id] {
						t.Fatalf("fleet %d step %d: Shares(%d, %v)[%s] = %d; want %d (shares changed while converging)", i, step, n, held, id, got[id], want[id])
					}
				}
			}
		}
	})
}
