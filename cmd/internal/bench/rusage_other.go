//go:build !unix

package bench

import "time"

// cpuTime is unavailable on this platform: it returns 0.
func cpuTime() time.Duration { return 0 }
