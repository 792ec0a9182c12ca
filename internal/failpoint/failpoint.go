//go:build !outbox_failpoints

package failpoint

// Inject marks the step name (e.g. "relay/after-fetch") where a crash test
// can stop the process (see failpoint_on.go, built with -tags
// outbox_failpoints). In a normal build it is empty and inlined: it costs
// nothing.
func Inject(string) {}
