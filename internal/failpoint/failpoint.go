//go:build !outbox_failpoints

package failpoint

// Inject marks the step name (e.g. "relay/after-fetch") where a crash test
// can stop the process (see failpoint_on.go); here it is empty.
func Inject(string) {}
