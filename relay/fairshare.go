package relay

import "sort"

// Shares divides bucketCount buckets among the active relays. held maps each
// active relay id (the caller included) to the number of unexpired leases it
// holds now. Every relay gets ⌊N/R⌋ buckets; the N mod R remaining ones go
// first to relays, in byte-wise id order, that already hold more than ⌊N/R⌋,
// then to the others in id order. So shares sum to N and differ by at most
// one, a relay beyond the N-th gets none, and shares stay put while relays
// move toward them: incumbents keep the remainder and joiners do not churn
// ownership. Every Store must use it, so that all relays agree.
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
