//go:build !outbox_failpoints

package relay

// failpoint marks a step of the relay's life where a crash test can stop the
// process (see failpoint_on.go, built with -tags outbox_failpoints). In a
// normal build it is empty and inlined: it costs nothing.
func failpoint(string) {}
