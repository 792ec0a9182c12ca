package relay

import (
	"maps"
	"slices"
	"sort"
)

// Shares divides bucketCount buckets among the active relays; held maps
// each (the caller included) to the unexpired leases it holds. Every relay
// gets ⌊N/R⌋; the N mod R others go first to relays, in byte-wise id order,
// already holding more, then to the rest in id order: incumbents keep the
// remainder and joiners do not churn ownership. Every Store must use it.
func Shares(bucketCount int, held map[string]int) map[string]int {
	out := make(map[string]int, len(held))
	if len(held) == 0 || bucketCount <= 0 {
		for id := range held {
			out[id] = 0
		}
		return out
	}
	ids := make([]string, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	sort.Strings(ids) // byte-wise
	base := bucketCount / len(ids)
	extra := bucketCount % len(ids)
	for _, id := range ids {
		out[id] = base
	}
	for pass := 0; pass < 2 && extra > 0; pass++ {
		for _, id := range ids {
			if extra == 0 {
				break
			}
			incumbent := held[id] > base
			if (pass == 0) == incumbent && out[id] == base {
				out[id]++
				extra--
			}
		}
	}
	return out
}

// ClaimStart is where relayID starts claiming free buckets among
// bucketCount: the relays counted in a round (held, as for Shares) each
// start at another point, so that relays starting together claim
// different buckets rather than collide on the lowest ones.
func ClaimStart(bucketCount int, relayID string, held map[string]int) int {
	ids := slices.Sorted(maps.Keys(held))
	i, _ := slices.BinarySearch(ids, relayID)
	return i * bucketCount / max(len(ids), 1)
}
